// The .npy header's dict literal (npy_header.h). Grammar (Python's, restricted to these values):
//   header := ws '{' ws [entry (ws ',' ws entry)* [ws ',']] ws '}' ws
//   entry  := string ws ':' ws value
//   value  := string | 'True' | 'False' | '(' ws ')' | '(' ws int ws ',' ws ')'
//           | '(' ws int (ws ',' ws int)+ [ws ','] ws ')'
//   int    := ['+' | '-'] ('0'+ | [1-9][0-9]*)
//   string := "'" chars "'" | '"' chars '"'   (no escapes; a line break ends it unterminated)
// where ws is spaces, tabs and line breaks (inside braces Python joins lines).
#include "io/npy_header.h"

#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <optional>
#include <string>

#include "distmuon/error.h"

namespace distmuon::detail {
namespace {

constexpr std::string_view kKeys[] = {"descr", "fortran_order", "shape"};

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  NpyHeader parse() {
    NpyHeader out;
    bool seen[3] = {false, false, false};
    skip_ws();
    expect('{');
    skip_ws();
    while (peek() != '}') {
      const std::size_t key_at = pos_;
      const std::string key = string_literal();
      std::size_t k = 0;
      while (k < 3 && kKeys[k] != key)
        ++k;
      if (k == 3) {
        fail(key_at, fmt::format("unexpected key '{}' (a .npy header has exactly 'descr', "
                                 "'fortran_order' and 'shape')",
                                 key));
      }
      if (seen[k]) fail(key_at, fmt::format("key '{}' appears twice", key));
      seen[k] = true;
      skip_ws();
      expect(':');
      skip_ws();
      if (k == 0) out.descr = descr_value();
      if (k == 1) out.fortran_order = bool_value();
      if (k == 2) out.shape = shape_value();
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        skip_ws();
      } else if (peek() != '}') {
        fail(pos_, "expected ',' or '}' after a value");
      }
    }
    ++pos_;  // '}'
    skip_ws();
    if (pos_ != text_.size()) fail(pos_, "unexpected text after the dict");
    for (std::size_t k = 0; k < 3; ++k)
      if (!seen[k]) throw Error(fmt::format("header has no '{}' field: {}", kKeys[k], text_));
    return out;
  }

 private:
  [[noreturn]] void fail(std::size_t at, const std::string& what) const {
    throw Error(
        fmt::format("header is not a valid .npy dict: {} at offset {}: {}", what, at, text_));
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void skip_ws() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
            text_[pos_] == '\r' || text_[pos_] == '\f'))
      ++pos_;
  }
  void expect(char c) {
    if (peek() != c) fail(pos_, fmt::format("expected '{}'", c));
    ++pos_;
  }

  std::string string_literal() {
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail(pos_, "expected a quoted string");
    const std::size_t start = ++pos_;
    while (pos_ < text_.size() && text_[pos_] != quote && text_[pos_] != '\n') {
      if (text_[pos_] == '\\') fail(pos_, "escapes in strings are not supported");
      ++pos_;
    }
    if (peek() != quote) fail(start - 1, "unterminated string");
    return std::string(text_.substr(start, pos_++ - start));
  }

  // A bare word or number: letters, digits, '_', '.', '+', '-' (a float such as 2.0 or 1e3 is
  // read whole so that it can be named).
  std::string_view token() {
    const std::size_t start = pos_;
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      const bool word = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
                        (c >= 'A' && c <= 'Z') || c == '_' || c == '.' ||
                        ((c == '+' || c == '-') &&
                         (pos_ == start || text_[pos_ - 1] == 'e' || text_[pos_ - 1] == 'E'));
      if (!word) break;
      ++pos_;
    }
    if (pos_ == start) fail(pos_, "expected a value");
    return text_.substr(start, pos_ - start);
  }

  std::string descr_value() {
    if (peek() != '\'' && peek() != '"') {
      fail(pos_, "'descr' is not a dtype string (structured dtypes are not supported)");
    }
    return string_literal();
  }

  bool bool_value() {
    const std::size_t at = pos_;
    const std::string_view t = peek() == '\'' || peek() == '"' || peek() == '(' ? "" : token();
    if (t == "True") return true;
    if (t == "False") return false;
    fail(at, "'fortran_order' is not True or False");
  }

  std::vector<Index> shape_value() {
    const std::size_t at = pos_;
    if (peek() != '(') fail(at, "'shape' is not a tuple of integers");
    ++pos_;
    std::vector<Index> dims;
    bool trailing_comma = false;
    skip_ws();
    while (peek() != ')') {
      dims.push_back(dimension());
      skip_ws();
      trailing_comma = peek() == ',';
      if (trailing_comma) {
        ++pos_;
        skip_ws();
      } else if (peek() != ')') {
        fail(pos_, "expected ',' or ')' in 'shape'");
      }
    }
    ++pos_;
    // (3) is the integer 3 in Python, not a tuple: NumPy refuses it as a shape.
    if (dims.size() == 1 && !trailing_comma)
      fail(at, "'shape' is not a tuple of integers (a 1-tuple needs a comma)");
    return dims;
  }

  Index dimension() {
    const std::size_t at = pos_;
    const std::string_view t = token();
    // Python's integer literals may group digits with single underscores (8_0 is 80), and
    // numpy.load reads the header with ast.literal_eval: the same is read here.
    std::string grouped(t);
    const auto misplaced = [&](std::size_t i) {
      return i == 0 || i + 1 >= grouped.size() ||
             !std::isdigit(static_cast<unsigned char>(grouped[i - 1])) ||
             !std::isdigit(static_cast<unsigned char>(grouped[i + 1]));
    };
    for (std::size_t i = 0; i < grouped.size(); ++i)
      if (grouped[i] == '_' && misplaced(i))
        fail(at, fmt::format("'shape' has {}, not an integer", t));
    std::erase(grouped, '_');
    std::string_view digits = grouped;
    const bool negative = !digits.empty() && digits.front() == '-';
    if (!digits.empty() && (digits.front() == '+' || digits.front() == '-'))
      digits.remove_prefix(1);
    const bool decimal =
        !digits.empty() && digits.find_first_not_of("0123456789") == std::string_view::npos &&
        (digits.front() != '0' || digits.find_first_not_of('0') == std::string_view::npos);
    if (!decimal) fail(at, fmt::format("'shape' has {}, not an integer", t));
    Index v = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (ec != std::errc() || end != digits.data() + digits.size())
      fail(at, fmt::format("dimension {} in 'shape' is implausible", t));
    if (negative && v != 0) fail(at, fmt::format("'shape' has a negative dimension {}", t));
    return v;
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

}  // namespace

NpyHeader parse_npy_header(std::string_view text) {
  return Parser(text).parse();
}

}  // namespace distmuon::detail
