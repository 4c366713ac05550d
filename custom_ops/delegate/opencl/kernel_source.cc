#include "kernel_source.h"

#include <cctype>
#include <cstddef>
#include <vector>

namespace difflite::gpu {
namespace {

struct KernelSpan {
  size_t begin = 0, end = 0;  // [begin, end): the function, from `__kernel` to its closing brace
  std::string name;
};

bool IsIdentChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// The index just past a comment starting at i, or i when none starts there.
size_t SkipComment(const std::string& text, size_t i) {
  if (text.compare(i, 2, "//") == 0) {
    const size_t nl = text.find('\n', i);
    return nl == std::string::npos ? text.size() : nl;
  }
  if (text.compare(i, 2, "/*") == 0) {
    const size_t close = text.find("*/", i + 2);
    return close == std::string::npos ? text.size() : close + 2;
  }
  return i;
}

// The kernel's name: the identifier right before the first '(' that follows
// `void`, or "" when the declaration does not look like one.
std::string KernelName(const std::string& text, size_t begin, size_t open_paren) {
  const size_t v = text.find("void", begin);
  if (v == std::string::npos || v > open_paren) return "";
  size_t end = open_paren;
  while (end > v && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  size_t start = end;
  while (start > v && IsIdentChar(text[start - 1])) --start;
  return text.substr(start, end - start);
}

// The function starting at `begin` (a line that starts with __kernel), or
// false when its body cannot be delimited.
bool SpanAt(const std::string& text, size_t begin, KernelSpan* span) {
  const size_t paren = text.find('(', text.find("void", begin));
  if (paren == std::string::npos) return false;
  span->name = KernelName(text, begin, paren);
  if (span->name.empty()) return false;
  int depth = 0;
  bool in_body = false;
  for (size_t i = paren; i < text.size();) {
    const size_t after = SkipComment(text, i);
    if (after != i) {
      i = after;
      continue;
    }
    const char c = text[i++];
    if (c == '{') {
      ++depth;
      in_body = true;
    } else if (c == '}' && --depth == 0 && in_body) {
      span->begin = begin;
      span->end = i;
      return true;
    } else if (c == ';' && !in_body) {
      return false;  // a prototype, not a definition
    }
  }
  return false;
}

std::vector<KernelSpan> KernelSpans(const std::string& text) {
  std::vector<KernelSpan> spans;
  for (size_t line = 0; line < text.size();) {
    size_t next = text.find('\n', line);
    next = next == std::string::npos ? text.size() : next + 1;
    KernelSpan span;
    if (text.compare(line, 8, "__kernel") == 0 && SpanAt(text, line, &span)) {
      spans.push_back(span);
      next = span.end;
    }
    line = next;
  }
  return spans;
}

}  // namespace

std::string KeepOneKernel(const std::string& text, const std::string& kernel) {
  const std::vector<KernelSpan> spans = KernelSpans(text);
  bool found = false;
  for (const KernelSpan& s : spans) found = found || s.name == kernel;
  if (!found) return text;
  std::string out;
  out.reserve(text.size());
  size_t copied = 0;
  for (const KernelSpan& s : spans) {
    if (s.name == kernel) continue;
    out.append(text, copied, s.begin - copied);
    for (size_t i = s.begin; i < s.end; ++i) {
      if (text[i] == '\n') out.push_back('\n');
    }
    copied = s.end;
  }
  out.append(text, copied, std::string::npos);
  return out;
}

}  // namespace difflite::gpu
