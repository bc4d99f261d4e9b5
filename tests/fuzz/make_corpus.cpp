// Writes the seed corpus of the trace reader fuzz target (tools/fuzz
// --make-corpus DIR): small traces of every format version made with the
// project's own writer and encoders, complete, unfinished and cut short.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "trace_format.h"
#include "trace_writer.h"

using namespace allocscope;
namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

void write_file(const fs::path& p, const std::string& bytes) {
    std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

TraceHeader header(uint32_t version = kTraceFormatVersion) {
    TraceHeader h;
    h.format_version = version;
    h.tool_version = "corpus";
    h.pid = 4242;
    h.rank = 1;
    h.world_size = 2;
    h.stack_depth = 24;
    h.start_wall_ns = 1'700'000'000'000'000'000ull;
    h.start_mono_ns = 123456789;
    return h;
}

// Every kind of event, with repeating and changing fields.
std::vector<Event> events(size_t n, uint64_t first_seq = 1) {
    std::vector<Event> out;
    uint64_t seq = first_seq;
    for (size_t i = 0; i < n; ++i) {
        Event e;
        e.seq = seq;
        seq += i % 7 == 3 ? 5 : 1;
        e.t_ns = i * 1000 + (i % 3) * 17;
        e.tid = 100 + static_cast<uint32_t>(i % 3);
        e.step = i / 20;
        e.layer = static_cast<uint32_t>(i % 4);  // strings 0..3
        e.phase = i % 2 ? 4 : 0;
        switch (i % 10) {
            case 0:
            case 1:
            case 2:
                e.kind = EventKind::alloc;
                e.level = i % 3 ? Level::segment : Level::block;
                e.memory = i % 5 ? MemoryKind::device : MemoryKind::host_pinned;
                e.api = i % 3 ? Api::cudaMalloc : Api::c_api;
                e.address = 0x7f0000000000ull + i * 4096;
                e.size = i % 4 ? 512 * (i + 1) : i * 3 + 1;
                e.stack = static_cast<uint32_t>(i % 3);  // stacks 0..2
                e.device = static_cast<int32_t>(i % 2);
                break;
            case 3:
            case 4:
                e.kind = EventKind::free;
                e.level = Level::segment;
                e.memory = MemoryKind::device;
                e.api = Api::cudaFree;
                e.address = 0x7f0000000000ull + (i - 3) * 4096;
                e.size = 512 * (i - 2);
                e.flags = i % 20 == 4 ? kFlagUnknownAddress : 0;
                e.result = i % 40 == 4 ? 1 : 0;
                e.device = 0;
                break;
            case 5:
                e.kind = EventKind::oom;
                e.level = Level::segment;
                e.api = Api::cudaMallocAsync;
                e.size = uint64_t{1} << 50;
                e.result = 2;
                e.stream = 0xdeadbeef;
                break;
            case 6:
                e.kind = EventKind::tag_push;
                e.api = Api::c_api;
                e.flags = i % 30 == 6 ? kFlagTagOverflow : 0;
                break;
            case 7:
                e.kind = EventKind::tag_pop;
                e.api = Api::c_api;
                break;
            case 8:
                e.kind = EventKind::step;
                e.api = Api::c_api;
                break;
            default:
                e.kind = i % 20 == 9 ? EventKind::mark : EventKind::param;
                e.api = Api::c_api;
                e.aux = e.kind == EventKind::mark ? 5 : 0;  // string 5 / param 0
                break;
        }
        out.push_back(e);
    }
    return out;
}

const std::vector<std::string> kStrings = {"",        "layers.0", "layers.1.mlp",
                                           "<b>&\"'", "forward",  "a mark"};

void definitions(TraceWriter& w) {
    for (uint32_t id = 1; id < kStrings.size(); ++id)
        w.string(id, kStrings[id]);
    const uint64_t f1[] = {0x401000, 0x401234, 0x7f00001000};
    const uint64_t f2[] = {0x402000};
    w.stack(1, f1);
    w.stack(2, f2);
    ModuleRecord m;
    m.base = 0x400000;
    m.size = 0x10000;
    m.build_id = std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8);
    m.path = "/usr/bin/program";
    w.module(m);
    ParamRecord p;
    p.index = 0;
    p.layer = 1;
    p.name = 2;
    p.dtype = 4;
    p.numel = 1 << 20;
    p.sharded_numel = 1 << 19;
    w.param(p);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: make_corpus DIR\n");
        return 2;
    }
    const fs::path dir = argv[1];
    fs::create_directories(dir);
    const fs::path scratch = dir / ".scratch.trace";
    auto made = [&](const std::string& name, auto&& fill, uint32_t version = 2) {
        fs::remove(scratch);
        TraceWriter w;
        std::string error;
        if (!w.open(scratch.string(), header(version), error)) {
            std::fprintf(stderr, "%s\n", error.c_str());
            std::exit(1);
        }
        fill(w);
        const std::string bytes = read_file(scratch);
        fs::remove(scratch);
        write_file(dir / name, bytes);
        return bytes;
    };
    FooterRecord footer;
    footer.events = 3;
    footer.unknown_frees = 1;
    footer.end_mono_ns = 999;

    // Version 2: complete, several blocks (a flush ends a block).
    const std::string v2 = made("v2-complete", [&](TraceWriter& w) {
        definitions(w);
        const auto evs = events(120);
        for (size_t i = 0; i < evs.size(); ++i) {
            w.event(evs[i]);
            if (i % 40 == 39) w.flush();
        }
        w.close(footer);
    });
    // Unfinished (no footer), and cut inside a record.
    made("v2-unfinished", [&](TraceWriter& w) {
        definitions(w);
        for (const Event& e : events(30))
            w.event(e);
        w.flush();
    });
    // Version 3: derived events (provenance) among the others.
    made(
        "v3-derived",
        [&](TraceWriter& w) {
            definitions(w);
            auto evs = events(60);
            for (size_t i = 0; i < evs.size(); ++i) {
                if (evs[i].kind != EventKind::param || i % 3 != 0) continue;
                evs[i].kind = EventKind::derived;
                evs[i].address = 0x7f0000001000ull + 512 * i;
                evs[i].stream = i % 2 ? 5 : 0;  // a text, or none
            }
            for (const Event& e : evs)
                w.event(e);
            w.close(footer);
        },
        3);
    write_file(dir / "v2-cut-in-block", v2.substr(0, v2.size() - 70));
    write_file(dir / "v2-cut-in-header", v2.substr(0, 40));
    write_file(dir / "v2-header-only", v2.substr(0, kTraceHeaderSize));
    // No definitions, events only.
    made("v2-no-defs", [&](TraceWriter& w) {
        Event e;
        e.seq = 1;
        e.kind = EventKind::step;
        e.step = 7;
        w.event(e);
        w.close(FooterRecord{});
    });
    // Extreme values in every field.
    made("v2-extremes", [&](TraceWriter& w) {
        definitions(w);
        Event e;
        e.seq = 1;
        e.kind = EventKind::alloc;
        e.level = Level::segment;
        e.memory = MemoryKind::managed;
        e.api = Api::cudaMallocManaged;
        e.address = ~uint64_t{0};
        e.size = ~uint64_t{0};
        e.stream = ~uint64_t{0};
        e.step = ~uint64_t{0};
        e.t_ns = ~uint64_t{0};
        e.tid = ~uint32_t{0};
        e.device = INT32_MIN;
        e.result = INT32_MAX;
        e.flags = ~uint32_t{0};
        w.event(e);
        e.seq = ~uint64_t{0};
        e.t_ns = 0;
        e.size = 511;
        e.device = -1;
        w.event(e);
        w.close(footer);
    });
    // Version 1: one record per event.
    {
        std::string bytes = encode_header(header(1));
        for (uint32_t id = 1; id < kStrings.size(); ++id) {
            std::string p;
            put_u32(p, id);
            append_record(bytes, RecordType::string, p + kStrings[id]);
        }
        std::string s;
        put_u32(s, 1);
        put_u32(s, 1);
        put_u64(s, 0x401000);
        append_record(bytes, RecordType::stack, s);
        append_record(bytes, RecordType::stack,
                      std::string("\x02\0\0\0\0\0\0\0", 8));  // id 2, depth 0
        std::string param;
        for (uint32_t v : {0u, 1u, 2u, 4u})
            put_u32(param, v);
        put_u64(param, 1024);
        put_u64(param, 512);
        append_record(bytes, RecordType::param, param);
        for (const Event& e : events(40)) {
            uint8_t payload[kEventPayloadSize];
            encode_event(payload, e);
            append_record(bytes, RecordType::event,
                          {reinterpret_cast<char*>(payload), sizeof payload});
        }
        std::string f;
        for (uint64_t v : {40ull, 0ull, 0ull, 0ull, 0ull, 1000ull})
            put_u64(f, v);
        write_file(dir / "v1-unfinished", bytes);
        append_record(bytes, RecordType::footer, f);
        write_file(dir / "v1-complete", bytes);
        write_file(dir / "v1-cut", bytes.substr(0, bytes.size() - 100));
    }
    write_file(dir / "not-a-trace", "#!/bin/sh\necho hello\n");
    write_file(dir / "empty", "");
    return 0;
}
