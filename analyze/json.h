// A small strict JSON parser (RFC 8259): the findings reader's, and tests'
// for the JSON the tools write. Values keep where they start in the text so
// a schema check can point at the offending value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "utf8.h"

namespace allocscope::json {

struct Value {
    enum class Type { null, boolean, number, string, array, object } type = Type::null;
    size_t offset = 0;  // where the value starts in the text
    bool boolean = false;
    std::string text;  // string contents, or a number's literal
    std::vector<Value> items;
    std::vector<std::pair<std::string, Value>> members;  // in document order

    // The member `name` of an object; nullptr when absent or not an object.
    const Value* find(std::string_view name) const;
    // The member `name`; throws std::out_of_range when absent.
    const Value& at(std::string_view name) const;
    // A number as an integer / a double; throws std::invalid_argument when
    // it is not a number or (as_u64, as_i64) not an integer in range.
    uint64_t as_u64() const;
    int64_t as_i64() const;
    double as_double() const;
};

// "null", "a boolean", "a number", "a string", "an array", "an object".
const char* type_name(Value::Type type) noexcept;

// A syntax error: `offset` into the text and the problem ("unterminated
// string", ...). what() is "line L, column C: <problem>".
class ParseError : public std::runtime_error {
  public:
    ParseError(size_t offset, size_t line, size_t column, std::string problem);
    size_t offset() const noexcept { return offset_; }
    size_t line() const noexcept { return line_; }
    size_t column() const noexcept { return column_; }
    const std::string& problem() const noexcept { return problem_; }

  private:
    size_t offset_, line_, column_;
    std::string problem_;
};

// One JSON document (surrounding whitespace allowed). Duplicate object
// members, invalid UTF-8, unpaired surrogates and nesting deeper than
// `max_depth` are errors. Throws ParseError.
Value parse(std::string_view text, int max_depth = 32);

// 1-based line and column of byte `offset` in `text`.
std::pair<size_t, size_t> line_column(std::string_view text, size_t offset) noexcept;

using allocscope::utf8_sequence;  // core/utf8.h

}  // namespace allocscope::json
