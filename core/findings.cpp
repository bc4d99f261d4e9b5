#include "findings.h"

#include <algorithm>
#include <cstdio>
#include <tuple>

#include "output_file.h"
#include "utf8.h"

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

void append_u_escape(std::string& out, unsigned code) {
    // As "\\u%04x" would write it (code < 0x10000), without formatting.
    static constexpr char kHex[] = "0123456789abcdef";
    const char text[6] = {'\\',
                          'u',
                          kHex[(code >> 12) & 15],
                          kHex[(code >> 8) & 15],
                          kHex[(code >> 4) & 15],
                          kHex[code & 15]};
    out.append(text, sizeof text);
}

void put_uint(std::string& out, uint64_t v) {
    out += std::to_string(v);
}

// A byte json_quote writes as it is: printable ASCII but the quote, the
// backslash and what HTML reads as markup.
constexpr bool plain_json_byte(unsigned char c) noexcept {
    return c >= 0x20 && c < 0x7F && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&';
}

}  // namespace

std::string json_quote(std::string_view text) {
    std::string out;
    out.reserve(text.size() + 2);
    out += '"';
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    size_t left = text.size();
    while (left > 0) {
        // A run of bytes written as they are, at once (most of any text).
        size_t run = 0;
        while (run < left && plain_json_byte(p[run]))
            ++run;
        if (run > 0) {
            out.append(reinterpret_cast<const char*>(p), run);
            p += run;
            left -= run;
            continue;
        }
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
        if (f.rank < 0 && f.pid != 0) out += ", \"pid\": " + std::to_string(f.pid);
        out += ", \"layer\": " + json_quote(f.layer);
        out += ", \"phase\": " + json_quote(f.phase);
        out += ", \"bytes\": ";
        put_uint(out, f.bytes);
        out += ", \"count\": ";
        put_uint(out, f.count);
        out += ",\n     \"summary\": " + json_quote(f.summary);
        if (!f.basis.empty()) out += ", \"basis\": " + json_quote(f.basis);
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
            if (!e.note.empty()) out += ", \"note\": " + json_quote(e.note);
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
        out += "]";
        if (!r.provenance.empty()) out += ", \"provenance\": " + json_quote(r.provenance);
        out += "}";
    }
    out += file.ranks.empty() ? "]\n}\n" : "\n  ]\n}\n";
    return out;
}

void write_findings_file(const std::string& path, const FindingsFile& file) {
    try {
        write_file_atomically(path, to_json(file));
    } catch (const std::runtime_error& e) {
        throw FindingsError(e.what());
    }
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

std::string printable(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (char c : s) {
        const auto u = static_cast<unsigned char>(c);
        out += (u < 0x20 || u == 0x7F) ? '?' : c;
    }
    return out;
}

std::string process_label(int32_t rank, uint32_t pid) {
    if (rank >= 0) return "rank " + std::to_string(rank);
    return pid != 0 ? "pid " + std::to_string(pid) : std::string("no rank");
}

std::string summary_line(const Finding& f) {
    return summary_line(f, process_label(f.rank, f.pid));
}

std::string summary_line(const Finding& f, std::string_view who) {
    std::string where = f.layer.empty() ? "-" : printable(f.layer);
    if (!f.phase.empty()) where += "/" + printable(f.phase);
    std::string line = std::string(to_string(f.severity));
    line.resize(8, ' ');
    line += printable(f.plugin);
    line += "  ";
    line += who;
    line += "  " + where + "  " + human_bytes(f.bytes) + "  ";
    if (!f.basis.empty()) line += "[" + printable(f.basis) + "]  ";
    line += printable(f.summary);
    return line;
}

}  // namespace allocscope
