// Line diffs: a minimal edit script (Myers' O(ND) algorithm in linear space)
// and its unified-format hunks, as `diff -u` and `git diff` print them.
//
// Texts are byte strings. A line includes its '\n'; only the last line of a
// text may lack one, and then it differs from the same characters followed
// by '\n' (the hunks say "\ No newline at end of file"). Pure functions,
// thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "agentbox/status.h"

namespace agentbox::session {

// The lines of `text`, each with its '\n' when it has one. "" has no lines.
std::vector<std::string_view> SplitLines(std::string_view text);

enum class LineOp : unsigned char {
  kEqual,   // the next line of each side
  kDelete,  // the next line of the old side
  kInsert,  // the next line of the new side
};

// An edit script turning `old_lines` into `new_lines`: Equal ops consume a
// line of each side, Delete one old line, Insert one new line. Within a
// changed block deletions come before insertions. Lines that occur only on
// one side are set aside before the search (they cannot be part of a longest
// common subsequence), so rewriting a whole file stays cheap; the search is
// O((N+M)·D) time and O(N+M) space. The script is a shortest one unless a
// stretch of the texts needs more than ~1,000 edits, where the search, as
// git's xdiff does, splits where it stands to bound the work (the script is
// still exact, only maybe longer).
std::vector<LineOp> DiffLines(const std::vector<std::string_view>& old_lines,
                              const std::vector<std::string_view>& new_lines);

// The hunks turning `old_text` into `new_text`, with `context` unchanged lines
// around each change (hunks closer than 2·context are merged), starting with
// "@@ -a,b +c,d @@" lines; no file header. "" when the texts are equal.
std::string UnifiedHunks(std::string_view old_text, std::string_view new_text, int context = 3);

// Applies hunks (as UnifiedHunks prints them) to `old_text` at exactly the
// positions they name, checking every context and removed line. Fails with
// stage "patch" naming the hunk and line that does not match.
Result<std::string> ApplyUnifiedHunks(std::string_view old_text, std::string_view hunks);

// git's object id of a blob holding `content`: the SHA-1 of
// "blob <size>\0<content>", 40 lowercase hex digits (SHA-1 repositories,
// git's default), as "index" lines of a patch name them.
std::string GitBlobId(std::string_view content);

// The body of a binary file's section as `git diff --binary` writes it:
// "GIT binary patch", then a forward hunk "literal <new size>" and a reverse
// one "literal <old size>", each the zlib-deflated bytes in base85 lines
// (a length character, A-Z for 1-26 bytes and a-z for 27-52, then 5
// characters per 4 bytes) ended by an empty line. `git apply` needs the
// section's full "index <old id>..<new id>" line with it, and checks both.
std::string GitBinaryPatch(std::string_view old_content, std::string_view new_content);

}  // namespace agentbox::session
