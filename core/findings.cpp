#include "findings.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <tuple>

namespace allocscope {

std::string_view to_string(Severity severity) noexcept {
    switch (severity) {
        case Severity::info:
            return "info";
        case Severity::warning:
            return "warning";
        case Severity::error:
            return "error";
    }
    return "unknown";
}

std::optional<Severity> parse_severity(std::string_view text) noexcept {
    if (text == "info") return Severity::info;
    if (text == "warning") return Severity::warning;
    if (text == "error") return Severity::error;
    return std::nullopt;
}

// --- writing -------------------------------------------------------------------

namespace {

// Length of the valid UTF-8 sequence at `p` (RFC 3629: no overlongs, no
// surrogates, nothing above U+10FFFF), 0 when it is not one.
size_t utf8_sequence(const unsigned char* p, size_t left) noexcept {
    const unsigned char c = p[0];
    if (c < 0x80) return 1;
    size_t n = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    if (left < n) return 0;
    if (p[1] < lo || p[1] > hi) return 0;
    for (size_t i = 2; i < n; ++i) {
        if (p[i] < 0x80 || p[i] > 0xBF) return 0;
    }
    return n;
}

void append_u_escape(std::string& out, unsigned code) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\u%04x", code);
    out += buf;
}

void put_uint(std::string& out, uint64_t v) {
    out += std::to_string(v);
}

}  // namespace

std::string json_quote(std::string_view text) {
    std::string out;
    out.reserve(text.size() + 2);
    out += '"';
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    size_t left = text.size();
    while (left > 0) {
        const unsigned char c = *p;
        if (c < 0x80) {
            switch (c) {
                case '"':
                    out += "\\\"";
                    break;
                case '\\':
                    out += "\\\\";
                    break;
                case '\n':
                    out += "\\n";
                    break;
                case '\r':
                    out += "\\r";
                    break;
                case '\t':
                    out += "\\t";
                    break;
                case '\b':
                    out += "\\b";
                    break;
                case '\f':
                    out += "\\f";
                    break;
                // An HTML report may embed the JSON in a <script> element.
                case '<':
                case '>':
                case '&':
                    append_u_escape(out, c);
                    break;
                default:
                    if (c < 0x20 || c == 0x7F) {
                        append_u_escape(out, c);
                    } else {
                        out += static_cast<char>(c);
                    }
            }
            ++p;
            --left;
            continue;
        }
        const size_t n = utf8_sequence(p, left);
        if (n == 0) {
            out += "\\ufffd";
            ++p;
            --left;
            continue;
        }
        // U+2028/U+2029 end lines in JavaScript before ES2019.
        if (n == 3 && p[0] == 0xE2 && p[1] == 0x80 && (p[2] == 0xA8 || p[2] == 0xA9)) {
            append_u_escape(out, p[2] == 0xA8 ? 0x2028 : 0x2029);
        } else {
            out.append(reinterpret_cast<const char*>(p), n);
        }
        p += n;
        left -= n;
    }
    out += '"';
    return out;
}

std::string to_json(const FindingsFile& file) {
    std::string out =
        "{\n  \"version\": " + std::to_string(kFindingsFormatVersion) + ",\n  \"findings\": [";
    for (size_t i = 0; i < file.findings.size(); ++i) {
        const Finding& f = file.findings[i];
        out += i ? ",\n    {" : "\n    {";
        out += "\"plugin\": " + json_quote(f.plugin);
        out += ", \"severity\": " + json_quote(to_string(f.severity));
        out += ", \"rank\": " + std::to_string(f.rank);
        out += ", \"layer\": " + json_quote(f.layer);
        out += ", \"phase\": " + json_quote(f.phase);
        out += ", \"bytes\": ";
        put_uint(out, f.bytes);
        out += ", \"count\": ";
        put_uint(out, f.count);
        out += ",\n     \"summary\": " + json_quote(f.summary);
        out += ",\n     \"evidence\": [";
        for (size_t k = 0; k < f.evidence.size(); ++k) {
            const Evidence& e = f.evidence[k];
            out += k ? ",\n       {" : "\n       {";
            out += "\"size\": ";
            put_uint(out, e.size);
            out += ", \"layer\": " + json_quote(e.layer);
            out += ", \"phase\": " + json_quote(e.phase);
            out += ", \"step\": ";
            put_uint(out, e.step);
            out += ", \"alloc_seq\": ";
            put_uint(out, e.alloc_seq);
            out += ", \"free_seq\": ";
            put_uint(out, e.free_seq);
            out += ", \"stack_id\": ";
            put_uint(out, e.stack_id);
            out += "}";
        }
        out += f.evidence.empty() ? "]}" : "\n     ]}";
    }
    out += file.findings.empty() ? "],\n" : "\n  ],\n";
    out += "  \"ranks\": [";
    for (size_t i = 0; i < file.ranks.size(); ++i) {
        const RankRun& r = file.ranks[i];
        out += i ? ",\n    {" : "\n    {";
        out += "\"rank\": " + std::to_string(r.rank);
        out += ", \"trace\": " + json_quote(r.trace);
        out += ", \"plugins\": [";
        for (size_t k = 0; k < r.plugins.size(); ++k)
            out += (k ? ", " : "") + json_quote(r.plugins[k]);
        out += "], \"disabled\": [";
        for (size_t k = 0; k < r.disabled.size(); ++k) {
            out += k ? ", " : "";
            out += "{\"plugin\": " + json_quote(r.disabled[k].plugin) +
                   ", \"reason\": " + json_quote(r.disabled[k].reason) + "}";
        }
        out += "]}";
    }
    out += file.ranks.empty() ? "]\n}\n" : "\n  ]\n}\n";
    return out;
}

// --- reading -------------------------------------------------------------------

namespace {

struct Value {
    enum class Type { null, boolean, number, string, array, object } type = Type::null;
    size_t offset = 0;  // where the value starts in the text
    bool boolean = false;
    std::string text;  // string contents, or a number's literal
    std::vector<Value> items;
    std::vector<std::pair<std::string, Value>> members;
};

const char* type_name(Value::Type t) {
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

class Parser {
  public:
    Parser(std::string_view text, const std::string& origin) : text_(text), origin_(origin) {}

    Value document() {
        skip_space();
        Value v = value(0);
        skip_space();
        if (pos_ != text_.size()) fail(pos_, "unexpected text after the JSON document");
        return v;
    }

    [[noreturn]] void fail(size_t offset, const std::string& problem) const {
        size_t line = 1, column = 1;
        for (size_t i = 0; i < offset && i < text_.size(); ++i) {
            if (text_[i] == '\n') {
                ++line;
                column = 1;
            } else {
                ++column;
            }
        }
        throw FindingsError(origin_ + ": line " + std::to_string(line) + ", column " +
                            std::to_string(column) + ": " + problem);
    }

  private:
    // Deep enough for the schema (4 levels) with room; bounded so a hostile
    // file cannot exhaust the stack.
    static constexpr int kMaxDepth = 32;

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
        if (depth > kMaxDepth) fail(pos_, "JSON nested too deeply");
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
    const std::string& origin_;
    size_t pos_ = 0;
};

// Maps the parsed tree onto the schema; every mismatch names where it is.
class SchemaReader {
  public:
    explicit SchemaReader(const Parser& parser) : parser_(parser) {}

    FindingsFile file(const Value& root) {
        need(root, Value::Type::object, "the document");
        FindingsFile out;
        check_members(root, "the document", {"version", "findings", "ranks"});
        if (const Value* v = find(root, "version")) {
            if (uint_value(*v, "\"version\"") != uint64_t{kFindingsFormatVersion}) {
                parser_.fail(v->offset, "unsupported findings format version " + v->text +
                                            " (this allocscope reads version " +
                                            std::to_string(kFindingsFormatVersion) + ")");
            }
        }
        const Value& findings = member(root, "findings", "the document");
        need(findings, Value::Type::array, "\"findings\"");
        for (size_t i = 0; i < findings.items.size(); ++i)
            out.findings.push_back(finding(findings.items[i], "finding " + std::to_string(i + 1)));
        const Value& ranks = member(root, "ranks", "the document");
        need(ranks, Value::Type::array, "\"ranks\"");
        for (size_t i = 0; i < ranks.items.size(); ++i)
            out.ranks.push_back(rank_run(ranks.items[i], "rank entry " + std::to_string(i + 1)));
        return out;
    }

  private:
    void need(const Value& v, Value::Type type, const std::string& what) const {
        if (v.type != type) {
            parser_.fail(v.offset,
                         what + " must be " + type_name(type) + ", not " + type_name(v.type));
        }
    }

    static const Value* find(const Value& object, std::string_view name) {
        for (const auto& m : object.members) {
            if (m.first == name) return &m.second;
        }
        return nullptr;
    }

    const Value& member(const Value& object, std::string_view name, const std::string& where) {
        const Value* v = find(object, name);
        if (!v) parser_.fail(object.offset, where + " lacks \"" + std::string(name) + "\"");
        return *v;
    }

    void check_members(const Value& object, const std::string& where,
                       std::initializer_list<std::string_view> known) const {
        for (const auto& m : object.members) {
            bool ok = false;
            for (std::string_view k : known)
                ok = ok || m.first == k;
            if (!ok)
                parser_.fail(m.second.offset, where + " has an unknown member \"" + m.first + "\"");
        }
    }

    std::string str(const Value& object, std::string_view name, const std::string& where) {
        const Value& v = member(object, name, where);
        need(v, Value::Type::string, where + ": \"" + std::string(name) + "\"");
        return v.text;
    }

    uint64_t uint_value(const Value& v, const std::string& what) const {
        uint64_t out = 0;
        if (v.type == Value::Type::number) {
            auto [ptr, ec] = std::from_chars(v.text.data(), v.text.data() + v.text.size(), out);
            if (ec == std::errc() && ptr == v.text.data() + v.text.size()) return out;
        }
        parser_.fail(v.offset, what + " must be an unsigned 64-bit integer");
    }

    uint64_t u64(const Value& object, std::string_view name, const std::string& where) {
        return uint_value(member(object, name, where), where + ": \"" + std::string(name) + "\"");
    }

    int32_t rank(const Value& object, const std::string& where) {
        const Value& v = member(object, "rank", where);
        int64_t out = 0;
        if (v.type == Value::Type::number) {
            auto [ptr, ec] = std::from_chars(v.text.data(), v.text.data() + v.text.size(), out);
            if (ec == std::errc() && ptr == v.text.data() + v.text.size() && out >= -1 &&
                out <= INT32_MAX) {
                return static_cast<int32_t>(out);
            }
        }
        parser_.fail(v.offset, where + ": \"rank\" must be an integer >= -1");
    }

    Finding finding(const Value& v, const std::string& where) {
        need(v, Value::Type::object, where);
        check_members(v, where,
                      {"plugin", "severity", "rank", "layer", "phase", "bytes", "count", "summary",
                       "evidence"});
        Finding f;
        f.plugin = str(v, "plugin", where);
        const Value& sev = member(v, "severity", where);
        need(sev, Value::Type::string, where + ": \"severity\"");
        auto parsed = parse_severity(sev.text);
        if (!parsed) {
            parser_.fail(
                sev.offset,
                where + ": \"severity\" must be info, warning or error, not \"" + sev.text + "\"");
        }
        f.severity = *parsed;
        f.rank = rank(v, where);
        f.layer = str(v, "layer", where);
        f.phase = str(v, "phase", where);
        f.bytes = u64(v, "bytes", where);
        f.count = u64(v, "count", where);
        f.summary = str(v, "summary", where);
        const Value& ev = member(v, "evidence", where);
        need(ev, Value::Type::array, where + ": \"evidence\"");
        for (size_t i = 0; i < ev.items.size(); ++i) {
            const Value& item = ev.items[i];
            const std::string at = where + ", evidence " + std::to_string(i + 1);
            need(item, Value::Type::object, at);
            check_members(item, at,
                          {"size", "layer", "phase", "step", "alloc_seq", "free_seq", "stack_id"});
            Evidence e;
            e.size = u64(item, "size", at);
            e.layer = str(item, "layer", at);
            e.phase = str(item, "phase", at);
            e.step = u64(item, "step", at);
            e.alloc_seq = u64(item, "alloc_seq", at);
            e.free_seq = u64(item, "free_seq", at);
            const uint64_t stack = u64(item, "stack_id", at);
            if (stack > UINT32_MAX) {
                parser_.fail(member(item, "stack_id", at).offset,
                             at + ": \"stack_id\" must fit in 32 bits");
            }
            e.stack_id = static_cast<uint32_t>(stack);
            f.evidence.push_back(std::move(e));
        }
        return f;
    }

    RankRun rank_run(const Value& v, const std::string& where) {
        need(v, Value::Type::object, where);
        check_members(v, where, {"rank", "trace", "plugins", "disabled"});
        RankRun r;
        r.rank = rank(v, where);
        r.trace = str(v, "trace", where);
        const Value& plugins = member(v, "plugins", where);
        need(plugins, Value::Type::array, where + ": \"plugins\"");
        for (const Value& p : plugins.items) {
            need(p, Value::Type::string, where + ": a plugin name");
            r.plugins.push_back(p.text);
        }
        const Value& disabled = member(v, "disabled", where);
        need(disabled, Value::Type::array, where + ": \"disabled\"");
        for (const Value& d : disabled.items) {
            need(d, Value::Type::object, where + ": a disabled plugin");
            check_members(d, where + ": a disabled plugin", {"plugin", "reason"});
            r.disabled.push_back({str(d, "plugin", where), str(d, "reason", where)});
        }
        return r;
    }

    const Parser& parser_;
};

}  // namespace

FindingsFile parse_findings(std::string_view text, const std::string& origin) {
    Parser parser(text, origin);
    Value root = parser.document();
    return SchemaReader(parser).file(root);
}

FindingsFile read_findings_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw FindingsError(path + ": cannot open: " + std::strerror(errno));
    std::stringstream ss;
    ss << in.rdbuf();
    if (in.bad()) throw FindingsError(path + ": read error");
    return parse_findings(ss.str(), path);
}

void write_findings_file(const std::string& path, const FindingsFile& file) {
    const std::string text = to_json(file);
    const std::string tmp = path + ".tmp" + std::to_string(getpid());
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) throw FindingsError("cannot write " + path + ": " + std::strerror(errno));
    size_t done = 0;
    while (done < text.size()) {
        ssize_t n = ::write(fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            const int err = n < 0 ? errno : EIO;
            ::close(fd);
            ::unlink(tmp.c_str());
            throw FindingsError("cannot write " + path + ": " + std::strerror(err));
        }
        done += static_cast<size_t>(n);
    }
    if (::close(fd) != 0) {
        const int err = errno;
        ::unlink(tmp.c_str());
        throw FindingsError("cannot write " + path + ": " + std::strerror(err));
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        const int err = errno;
        ::unlink(tmp.c_str());
        throw FindingsError("cannot write " + path + ": " + std::strerror(err));
    }
}

FindingsFile merge_findings(std::vector<FindingsFile> files) {
    auto key = [](const FindingsFile& f) {
        const int32_t rank = f.ranks.empty() ? -1 : f.ranks.front().rank;
        const std::string trace = f.ranks.empty() ? std::string() : f.ranks.front().trace;
        return std::make_tuple(rank < 0, rank, trace);
    };
    std::stable_sort(
        files.begin(), files.end(),
        [&key](const FindingsFile& a, const FindingsFile& b) { return key(a) < key(b); });
    FindingsFile out;
    for (const FindingsFile& f : files) {
        out.findings.insert(out.findings.end(), f.findings.begin(), f.findings.end());
        out.ranks.insert(out.ranks.end(), f.ranks.begin(), f.ranks.end());
    }
    return out;
}

size_t count_at_least(const FindingsFile& file, Severity threshold) noexcept {
    size_t n = 0;
    for (const Finding& f : file.findings)
        n += f.severity >= threshold;
    return n;
}

std::string human_bytes(uint64_t bytes) {
    static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes < 1024) return std::to_string(bytes) + " B";
    double v = static_cast<double>(bytes);
    int u = 0;
    while (v >= 1024.0 && u < 6) {
        v /= 1024.0;
        ++u;
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, v < 10 ? "%.2f %s" : (v < 100 ? "%.1f %s" : "%.0f %s"), v,
                  units[u]);
    return buf;
}

namespace {

std::string printable(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (char c : s) {
        const auto u = static_cast<unsigned char>(c);
        out += (u < 0x20 || u == 0x7F) ? '?' : c;
    }
    return out;
}

}  // namespace

std::string summary_line(const Finding& f) {
    std::string where = f.layer.empty() ? "-" : printable(f.layer);
    if (!f.phase.empty()) where += "/" + printable(f.phase);
    std::string line = std::string(to_string(f.severity));
    line.resize(8, ' ');
    line += printable(f.plugin);
    line += f.rank >= 0 ? "  rank " + std::to_string(f.rank) : std::string("  no rank");
    line += "  " + where + "  " + human_bytes(f.bytes) + "  " + printable(f.summary);
    return line;
}

}  // namespace allocscope
