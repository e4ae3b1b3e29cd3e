#include "cli/report_sink.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "linux/fd.h"
#include "linux/random.h"

namespace agentbox::cli {
namespace {

// "EACCES (Permission denied)"
std::string ErrnoText(int err) {
  const char* name = strerrorname_np(err);
  return std::string(name ? name : std::to_string(err).c_str()) + " (" + std::strerror(err) + ")";
}

Status FileError(const std::string& path, const std::string& what) {
  return Status::Error("report", "--report " + path + ": " + what);
}

Status FileErrno(const std::string& path, const std::string& call, int err) {
  return FileError(path, call + ": " + ErrnoText(err));
}

// A name beside FILE that no one else picks: O_EXCL refuses it if someone did.
std::string TempName() { return ".agentbox-report-" + linux::RandomHex(8) + ".tmp"; }

}  // namespace

Result<ReportSink> ReportSink::ToFile(const std::string& path) {
  const std::filesystem::path p(path);
  const std::string name = p.filename().string();
  if (name.empty() || name == "." || name == "..") return FileError(path, "names a directory, not a file");
  const std::string dir = p.has_parent_path() ? p.parent_path().string() : ".";
  ReportSink sink;
  sink.path_ = path;
  sink.name_ = name;
  sink.dir_.reset(open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!sink.dir_.valid()) return FileErrno(path, "open(" + dir + ")", errno);
  struct stat st;
  if (fstatat(sink.dir_.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    if (S_ISLNK(st.st_mode)) {
      return FileError(path, "is a symlink, which a report never follows (name a regular file, or use --report-fd)");
    }
    if (!S_ISREG(st.st_mode)) return FileError(path, "exists and is not a regular file (use --report-fd for a pipe)");
    // Replacing it is a rename over it: in a sticky directory (/tmp) the
    // kernel allows that only to its owner, the directory's, or root.
    struct stat d;
    const uid_t me = geteuid();
    if (fstat(sink.dir_.get(), &d) == 0 && (d.st_mode & S_ISVTX) && me != 0 && st.st_uid != me && d.st_uid != me) {
      return FileError(path, "belongs to uid " + std::to_string(st.st_uid) + " in the sticky directory " + dir +
                                 ": it cannot be replaced");
    }
  } else if (errno != ENOENT) {
    return FileErrno(path, "fstatat", errno);
  }
  // Writable: prove it with the temporary file the report would use.
  const std::string probe = TempName();
  linux::UniqueFd fd(openat(sink.dir_.get(), probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) return FileErrno(path, "cannot create a file in " + dir + ": openat", errno);
  unlinkat(sink.dir_.get(), probe.c_str(), 0);
  return sink;
}

Result<ReportSink> ReportSink::ToFd(int fd) {
  const std::string flag = "--report-fd " + std::to_string(fd);
  if (fd >= 0 && fd <= 2) {
    return Status::Error("report", flag + ": is the command's " +
                                       std::string(fd == 0 ? "stdin" : fd == 1 ? "stdout" : "stderr") +
                                       "; pass another descriptor (e.g. 3>FILE)");
  }
  const int flags = fd < 0 ? -1 : fcntl(fd, F_GETFL);
  if (flags < 0) return Status::Error("report", flag + ": not an open file descriptor in this process");
  if ((flags & O_ACCMODE) == O_RDONLY) return Status::Error("report", flag + ": open for reading only");
  // The runner closes what it inherits above stderr anyway; this keeps the
  // descriptor from every exec on the way as well.
  if (fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) return Status::Error("report", flag + ": F_SETFD: " + ErrnoText(errno));
  ReportSink sink;
  sink.fd_ = fd;
  return sink;
}

Status ReportSink::Write(const std::string& text) const {
  if (fd_ >= 0) {
    if (!linux::WriteAll(fd_, text)) {
      return Status::Error("report", "--report-fd " + std::to_string(fd_) + ": write: " + ErrnoText(errno));
    }
    return Status();
  }
  if (!dir_.valid()) return Status();
  const std::string temp = TempName();
  linux::UniqueFd fd(openat(dir_.get(), temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) return FileErrno(path_, "openat(" + temp + ")", errno);
  // Exactly 0600 whatever the umask: the report names paths and hosts.
  int err = fchmod(fd.get(), 0600) == 0 ? 0 : errno;
  if (err == 0 && !linux::WriteAll(fd.get(), text)) err = errno ? errno : EIO;
  if (err == 0 && close(fd.release()) != 0) err = errno;
  if (err == 0 && renameat(dir_.get(), temp.c_str(), dir_.get(), name_.c_str()) != 0) err = errno;
  if (err != 0) {
    unlinkat(dir_.get(), temp.c_str(), 0);
    return FileErrno(path_, "writing it", err);
  }
  return Status();
}

void ReportFlags::Register(CLI::App* app) {
  app->add_option("--report", file,
                  "write the outcome report (JSON) to FILE, whole (a new 0600 file renamed over FILE)");
  app->add_option("--report-fd", fd, "write the outcome report (JSON) to the inherited descriptor N");
}

Result<ReportSink> ReportFlags::Open() const {
  if (!file.empty() && fd) return Status::Error("report", "--report and --report-fd: give one of them");
  if (!file.empty()) return ReportSink::ToFile(file);
  if (fd) return ReportSink::ToFd(*fd);
  return ReportSink();
}

Status ReportFlags::CheckForWrap() const {
  if (!file.empty() && fd) return Status::Error("report", "--report and --report-fd: give one of them");
  if (!file.empty()) {
    auto sink = ReportSink::ToFile(file);
    return sink.ok() ? Status() : sink.status();
  }
  if (fd && *fd <= 2) {
    return Status::Error("report", "--report-fd " + std::to_string(*fd) +
                                       ": pass a descriptor above 2 (0-2 are the command's stdio)");
  }
  return Status();
}

std::vector<std::string> ReportFlags::ForExec() const {
  if (fd) return {"--report-fd", std::to_string(*fd)};
  if (file.empty()) return {};
  std::error_code ec;
  // Not normalised: "dir/../r.json" keeps meaning what it does when dir is a symlink.
  auto abs = std::filesystem::absolute(file, ec);
  return {"--report", ec ? file : abs.string()};
}

}  // namespace agentbox::cli
