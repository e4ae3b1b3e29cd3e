#include "daemon/api.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include "daemon/client.h"

namespace agentbox::daemon {
namespace {

// The log endpoint sends the log as it was when the request came: lines
// appended while it is being sent (a busy session) are not, and a log that
// keeps growing cannot keep the answer going.
TEST(LogEndpoint, StopsAtTheSizeSeenAtTheStart) {
  char path[] = "/tmp/agentbox-log-test-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  std::string start;
  for (int i = 0; i < 3000; ++i) start += "{\"line\":" + std::to_string(i) + "}\n";
  start += "{\"partial";  // a line still being written
  ASSERT_EQ(pwrite(fd, start.data(), start.size(), 0), static_cast<ssize_t>(start.size()));
  const std::uint64_t size = start.size();
  std::string sent;
  int chunks = 0;
  SendLogPrefix(fd, size, [&](std::string chunk) {
    sent += chunk;
    ++chunks;
    // The session goes on logging while the answer is sent.
    std::string more(100000, 'x');
    more += '\n';
    EXPECT_EQ(pwrite(fd, more.data(), more.size(), static_cast<off_t>(size + (chunks - 1) * more.size())),
              static_cast<ssize_t>(more.size()));
    return true;
  });
  close(fd);
  EXPECT_EQ(sent, start.substr(0, start.rfind('\n') + 1));
}

TEST(Sse, EventsSurviveAnySplit) {
  const std::string stream = SseEvent("output", "line one\n") + SseEvent("output", "é\nx") +
                             SseEvent("result", {{"kind", "exited"}, {"exit_code", 0}});
  for (std::size_t piece = 1; piece <= stream.size(); piece += 3) {
    std::vector<std::pair<std::string, std::string>> events;
    SseParser parser([&](const std::string& e, const std::string& d) { events.emplace_back(e, d); });
    for (std::size_t i = 0; i < stream.size(); i += piece) parser.Feed(std::string_view(stream).substr(i, piece));
    ASSERT_EQ(events.size(), 3u) << "piece " << piece;
    EXPECT_EQ(nlohmann::json::parse(events[0].second), "line one\n");
    EXPECT_EQ(nlohmann::json::parse(events[1].second), "é\nx");
    EXPECT_EQ(events[2].first, "result");
    EXPECT_EQ(nlohmann::json::parse(events[2].second)["kind"], "exited");
  }
}

TEST(Sse, Utf8SequencesAreNotCutBetweenChunks) {
  const std::string euro = "\xe2\x82\xac";  // €
  std::string tail;
  EXPECT_EQ(TakeCompleteUtf8("ab" + euro.substr(0, 1), &tail), "ab");
  EXPECT_EQ(tail, euro.substr(0, 1));
  EXPECT_EQ(TakeCompleteUtf8(tail + euro.substr(1, 1), &tail), "");
  EXPECT_EQ(TakeCompleteUtf8(tail + euro.substr(2) + "c", &tail), euro + "c");
  EXPECT_EQ(tail, "");
  EXPECT_EQ(TakeCompleteUtf8("plain", &tail), "plain");
  EXPECT_EQ(TakeCompleteUtf8("", &tail), "");
  // Invalid bytes are passed on (and replaced when encoded), never held.
  EXPECT_EQ(TakeCompleteUtf8("\xff", &tail), "\xff");
  EXPECT_EQ(tail, "");
}

TEST(Endpoint, UrlsAreLoopbackHttpOnly) {
  auto ok = Endpoint::FromUrl("http://127.0.0.1:7070/");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->port, 7070);
  EXPECT_EQ(ok->Describe(), "http://127.0.0.1:7070");
  EXPECT_FALSE(Endpoint::FromUrl("https://127.0.0.1:7070").ok());
  EXPECT_FALSE(Endpoint::FromUrl("http://example.com:80").ok());
  EXPECT_FALSE(Endpoint::FromUrl("http://10.1.1.1:80").ok());
}

}  // namespace
}  // namespace agentbox::daemon
