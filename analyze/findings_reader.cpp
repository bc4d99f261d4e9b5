// The findings file reader (analyze/findings_reader.h).
#include "findings_reader.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>
#include <tuple>

#include "json.h"

namespace allocscope {

namespace {

using json::type_name;
using json::Value;

// Errors name the document and the line and column of the offending value.
class Parser {
  public:
    Parser(std::string_view text, const std::string& origin) : text_(text), origin_(origin) {}

    Value document() const {
        try {
            return json::parse(text_);
        } catch (const json::ParseError& e) {
            throw FindingsError(origin_ + ": " + e.what());
        }
    }

    [[noreturn]] void fail(size_t offset, const std::string& problem) const {
        const auto [line, column] = json::line_column(text_, offset);
        throw FindingsError(origin_ + ": line " + std::to_string(line) + ", column " +
                            std::to_string(column) + ": " + problem);
    }

  private:
    std::string_view text_;
    const std::string& origin_;
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
                      {"plugin", "severity", "rank", "pid", "layer", "phase", "bytes", "count",
                       "summary", "basis", "evidence"});
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
        if (find(v, "pid")) {  // optional: a process without a rank
            const uint64_t pid = u64(v, "pid", where);
            if (pid == 0 || pid > UINT32_MAX || f.rank >= 0) {
                parser_.fail(member(v, "pid", where).offset,
                             where + ": \"pid\" must be a process id > 0, and only without a rank");
            }
            f.pid = static_cast<uint32_t>(pid);
        }
        f.layer = str(v, "layer", where);
        f.phase = str(v, "phase", where);
        f.bytes = u64(v, "bytes", where);
        f.count = u64(v, "count", where);
        f.summary = str(v, "summary", where);
        if (find(v, "basis")) f.basis = str(v, "basis", where);  // optional: "" when absent
        const Value& ev = member(v, "evidence", where);
        need(ev, Value::Type::array, where + ": \"evidence\"");
        for (size_t i = 0; i < ev.items.size(); ++i) {
            const Value& item = ev.items[i];
            const std::string at = where + ", evidence " + std::to_string(i + 1);
            need(item, Value::Type::object, at);
            check_members(
                item, at,
                {"size", "layer", "phase", "step", "alloc_seq", "free_seq", "stack_id", "note"});
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
            if (find(item, "note")) e.note = str(item, "note", at);  // optional
            f.evidence.push_back(std::move(e));
        }
        return f;
    }

    RankRun rank_run(const Value& v, const std::string& where) {
        need(v, Value::Type::object, where);
        check_members(v, where, {"rank", "trace", "plugins", "disabled", "provenance"});
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
        if (find(v, "provenance")) r.provenance = str(v, "provenance", where);  // optional
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

}  // namespace allocscope
