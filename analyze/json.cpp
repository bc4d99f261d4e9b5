#include "json.h"

#include <cerrno>
#include <charconv>
#include <cstdlib>

namespace allocscope::json {

const char* type_name(Value::Type t) noexcept {
    switch (t) {
        case Value::Type::null:
            return "null";
        case Value::Type::boolean:
            return "a boolean";
        case Value::Type::number:
            return "a number";
        case Value::Type::string:
            return "a string";
        case Value::Type::array:
            return "an array";
        case Value::Type::object:
            return "an object";
    }
    return "?";
}

const Value* Value::find(std::string_view name) const {
    for (const auto& m : members) {
        if (m.first == name) return &m.second;
    }
    return nullptr;
}

const Value& Value::at(std::string_view name) const {
    const Value* v = find(name);
    if (!v) throw std::out_of_range("no member \"" + std::string(name) + "\"");
    return *v;
}

uint64_t Value::as_u64() const {
    uint64_t out = 0;
    if (type == Type::number) {
        auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
        if (ec == std::errc() && ptr == text.data() + text.size()) return out;
    }
    throw std::invalid_argument("not an unsigned 64-bit integer: " + text);
}

int64_t Value::as_i64() const {
    int64_t out = 0;
    if (type == Type::number) {
        auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
        if (ec == std::errc() && ptr == text.data() + text.size()) return out;
    }
    throw std::invalid_argument("not a 64-bit integer: " + text);
}

double Value::as_double() const {
    if (type != Type::number) throw std::invalid_argument("not a number");
    return std::strtod(text.c_str(), nullptr);
}

std::pair<size_t, size_t> line_column(std::string_view text, size_t offset) noexcept {
    size_t line = 1, column = 1;
    for (size_t i = 0; i < offset && i < text.size(); ++i) {
        if (text[i] == '\n') {
            ++line;
            column = 1;
        } else {
            ++column;
        }
    }
    return {line, column};
}

ParseError::ParseError(size_t offset, size_t line, size_t column, std::string problem)
    : std::runtime_error("line " + std::to_string(line) + ", column " + std::to_string(column) +
                         ": " + problem),
      offset_(offset),
      line_(line),
      column_(column),
      problem_(std::move(problem)) {}

namespace {

class Parser {
  public:
    Parser(std::string_view text, int max_depth) : text_(text), max_depth_(max_depth) {}

    Value document() {
        skip_space();
        Value v = value(0);
        skip_space();
        if (pos_ != text_.size()) fail(pos_, "unexpected text after the JSON document");
        return v;
    }

  private:
    [[noreturn]] void fail(size_t offset, const std::string& problem) const {
        const auto [line, column] = line_column(text_, offset);
        throw ParseError(offset, line, column, problem);
    }

    void skip_space() {
        while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                       text_[pos_] == '\n' || text_[pos_] == '\r')) {
            ++pos_;
        }
    }

    void expect_literal(std::string_view word) {
        if (text_.substr(pos_, word.size()) != word) fail(pos_, "invalid JSON value");
        pos_ += word.size();
    }

    Value value(int depth) {
        if (depth > max_depth_) fail(pos_, "JSON nested too deeply");
        if (pos_ >= text_.size()) fail(pos_, "unexpected end of the file");
        Value v;
        v.offset = pos_;
        const char c = text_[pos_];
        if (c == '{') {
            v.type = Value::Type::object;
            ++pos_;
            skip_space();
            if (peek() == '}') {
                ++pos_;
                return v;
            }
            for (;;) {
                skip_space();
                if (peek() != '"') fail(pos_, "expected a member name in double quotes");
                const size_t name_at = pos_;
                std::string name = string();
                for (const auto& m : v.members) {
                    if (m.first == name) fail(name_at, "duplicate member \"" + name + "\"");
                }
                skip_space();
                if (peek() != ':') fail(pos_, "expected ':' after a member name");
                ++pos_;
                skip_space();
                Value member = value(depth + 1);
                v.members.emplace_back(std::move(name), std::move(member));
                skip_space();
                if (peek() == ',') {
                    ++pos_;
                    continue;
                }
                if (peek() == '}') {
                    ++pos_;
                    return v;
                }
                fail(pos_, "expected ',' or '}' in an object");
            }
        }
        if (c == '[') {
            v.type = Value::Type::array;
            ++pos_;
            skip_space();
            if (peek() == ']') {
                ++pos_;
                return v;
            }
            for (;;) {
                skip_space();
                v.items.push_back(value(depth + 1));
                skip_space();
                if (peek() == ',') {
                    ++pos_;
                    continue;
                }
                if (peek() == ']') {
                    ++pos_;
                    return v;
                }
                fail(pos_, "expected ',' or ']' in an array");
            }
        }
        if (c == '"') {
            v.type = Value::Type::string;
            v.text = string();
            return v;
        }
        if (c == 't' || c == 'f') {
            v.type = Value::Type::boolean;
            v.boolean = c == 't';
            expect_literal(v.boolean ? "true" : "false");
            return v;
        }
        if (c == 'n') {
            expect_literal("null");
            return v;
        }
        if (c == '-' || (c >= '0' && c <= '9')) {
            v.type = Value::Type::number;
            v.text = number();
            return v;
        }
        fail(pos_, "invalid JSON value");
    }

    char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }

    std::string number() {
        const size_t start = pos_;
        if (peek() == '-') ++pos_;
        if (peek() == '0') {
            ++pos_;
        } else if (peek() >= '1' && peek() <= '9') {
            while (peek() >= '0' && peek() <= '9')
                ++pos_;
        } else {
            fail(start, "invalid number");
        }
        if (peek() == '.') {
            ++pos_;
            if (!(peek() >= '0' && peek() <= '9')) fail(start, "invalid number");
            while (peek() >= '0' && peek() <= '9')
                ++pos_;
        }
        if (peek() == 'e' || peek() == 'E') {
            ++pos_;
            if (peek() == '+' || peek() == '-') ++pos_;
            if (!(peek() >= '0' && peek() <= '9')) fail(start, "invalid number");
            while (peek() >= '0' && peek() <= '9')
                ++pos_;
        }
        return std::string(text_.substr(start, pos_ - start));
    }

    unsigned hex4(size_t at) {
        if (at + 4 > text_.size()) fail(at, "truncated \\u escape");
        unsigned v = 0;
        for (size_t i = at; i < at + 4; ++i) {
            const char h = text_[i];
            v <<= 4;
            if (h >= '0' && h <= '9') {
                v |= unsigned(h - '0');
            } else if (h >= 'a' && h <= 'f') {
                v |= unsigned(h - 'a' + 10);
            } else if (h >= 'A' && h <= 'F') {
                v |= unsigned(h - 'A' + 10);
            } else {
                fail(at, "invalid \\u escape");
            }
        }
        return v;
    }

    static void put_utf8(std::string& out, unsigned cp) {
        if (cp < 0x80) {
            out += static_cast<char>(cp);
        } else if (cp < 0x800) {
            out += static_cast<char>(0xC0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out += static_cast<char>(0xE0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        } else {
            out += static_cast<char>(0xF0 | (cp >> 18));
            out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        }
    }

    std::string string() {
        const size_t start = pos_;
        ++pos_;  // the opening quote
        std::string out;
        for (;;) {
            if (pos_ >= text_.size()) fail(start, "unterminated string");
            const auto c = static_cast<unsigned char>(text_[pos_]);
            if (c == '"') {
                ++pos_;
                return out;
            }
            if (c < 0x20) fail(pos_, "control character inside a string (must be escaped)");
            if (c == '\\') {
                const char e = pos_ + 1 < text_.size() ? text_[pos_ + 1] : '\0';
                pos_ += 2;
                switch (e) {
                    case '"':
                        out += '"';
                        break;
                    case '\\':
                        out += '\\';
                        break;
                    case '/':
                        out += '/';
                        break;
                    case 'b':
                        out += '\b';
                        break;
                    case 'f':
                        out += '\f';
                        break;
                    case 'n':
                        out += '\n';
                        break;
                    case 'r':
                        out += '\r';
                        break;
                    case 't':
                        out += '\t';
                        break;
                    case 'u': {
                        unsigned cp = hex4(pos_);
                        pos_ += 4;
                        if (cp >= 0xD800 && cp <= 0xDBFF) {
                            if (text_.substr(pos_, 2) != "\\u") {
                                fail(pos_ - 6, "unpaired surrogate in a \\u escape");
                            }
                            unsigned low = hex4(pos_ + 2);
                            if (low < 0xDC00 || low > 0xDFFF) {
                                fail(pos_, "unpaired surrogate in a \\u escape");
                            }
                            pos_ += 6;
                            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                            fail(pos_ - 6, "unpaired surrogate in a \\u escape");
                        }
                        put_utf8(out, cp);
                        break;
                    }
                    default:
                        fail(pos_ - 2, "invalid escape in a string");
                }
                continue;
            }
            const size_t n = utf8_sequence(
                reinterpret_cast<const unsigned char*>(text_.data()) + pos_, text_.size() - pos_);
            if (n == 0) fail(pos_, "invalid UTF-8 inside a string");
            out.append(text_.substr(pos_, n));
            pos_ += n;
        }
    }

    std::string_view text_;
    int max_depth_;
    size_t pos_ = 0;
};

}  // namespace

Value parse(std::string_view text, int max_depth) {
    return Parser(text, max_depth).document();
}

}  // namespace allocscope::json
