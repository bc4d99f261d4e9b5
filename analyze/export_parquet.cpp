// The Parquet export (export.h, ParquetExport): rows go into in-memory
// DuckDB tables through the appender, and DuckDB writes them as a
// Hive-partitioned Parquet dataset (COPY ... PARTITION_BY (run, rank)).
// DuckDB is opened at run time through its stable C API (duckdb_api.h), so
// allocscope neither builds nor links against it; docs/DESIGN.md says why.
// Longer than 600 lines: one file holds the C API binding, the table schemas
// and the appenders, which change together when a column is added.
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "analysis.h"
#include "config.h"
#include "duckdb_api.h"
#include "export.h"
#include "export_live.h"
#include "output_file.h"
#include "replay.h"

namespace allocscope {

namespace {

namespace fs = std::filesystem;
using namespace duckdb_c;

constexpr uint64_t kNoSeq = ~uint64_t{0};

// --- The library ---------------------------------------------------------------

struct DuckDbApi {
    std::string path;
    std::string version;
    duckdb_library_version_fn library_version = nullptr;
    duckdb_create_config_fn create_config = nullptr;
    duckdb_set_config_fn set_config = nullptr;
    duckdb_destroy_config_fn destroy_config = nullptr;
    duckdb_open_ext_fn open_ext = nullptr;
    duckdb_close_fn close = nullptr;
    duckdb_connect_fn connect = nullptr;
    duckdb_disconnect_fn disconnect = nullptr;
    duckdb_free_fn free = nullptr;
    duckdb_query_fn query = nullptr;
    duckdb_result_error_fn result_error = nullptr;
    duckdb_destroy_result_fn destroy_result = nullptr;
    duckdb_appender_create_fn appender_create = nullptr;
    duckdb_appender_error_fn appender_error = nullptr;
    duckdb_appender_close_fn appender_close = nullptr;
    duckdb_appender_destroy_fn appender_destroy = nullptr;
    duckdb_appender_end_row_fn appender_end_row = nullptr;
    duckdb_append_bool_fn append_bool = nullptr;
    duckdb_append_int32_fn append_int32 = nullptr;
    duckdb_append_uint32_fn append_uint32 = nullptr;
    duckdb_append_uint64_fn append_uint64 = nullptr;
    duckdb_append_varchar_length_fn append_varchar_length = nullptr;
    duckdb_append_null_fn append_null = nullptr;
};

constexpr const char* kHowToGet =
    "set ALLOCSCOPE_DUCKDB to the path of libduckdb.so (DuckDB 1.0 or newer): it is in DuckDB's "
    "libduckdb-linux-<arch>.zip releases and in the npm package @duckdb/node-bindings-linux-x64 "
    "(npm pack @duckdb/node-bindings-linux-x64, then package/libduckdb.so in the tarball), or "
    "install it where the dynamic loader looks";

// DuckDB 1.x: "v1.5.6" (dev builds add a suffix). 0 when unreadable.
int major_version(const std::string& version) {
    const char* p = version.c_str();
    if (*p == 'v') ++p;
    int major = 0;
    const auto [end, ec] = std::from_chars(p, p + std::strlen(p), major);
    return ec == std::errc() && end != p ? major : 0;
}

// Loads the library once per process and keeps it loaded (DuckDB's own
// static objects and thread-locals stay valid until exit). A failed load
// is retried on the next call.
const DuckDbApi& duckdb_api() {
    static std::mutex mutex;
    static std::unique_ptr<DuckDbApi> loaded;
    const std::lock_guard lock(mutex);
    if (loaded) return *loaded;

    // ALLOCSCOPE_DUCKDB, read through the configuration table (config_table.h).
    const std::string env = parse_config([](const char* name) { return std::getenv(name); }).duckdb;
    const bool named = !env.empty();
    const std::string path = named ? env : "libduckdb.so";
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        const char* why = ::dlerror();
        throw std::runtime_error(
            std::string("--format parquet needs DuckDB's C library, and ") +
            (named ? "ALLOCSCOPE_DUCKDB=" + path + " could not be loaded"
                   : std::string("libduckdb.so is not on the library search path")) +
            " (" + (why ? why : "dlopen failed") + "): " + kHowToGet);
    }
    auto api = std::make_unique<DuckDbApi>();
    api->path = path;
    std::string missing;
    auto get = [&](auto& fn, const char* name) {
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(handle, name));
        if (!fn && missing.empty()) missing = name;
    };
    get(api->library_version, "duckdb_library_version");
    get(api->create_config, "duckdb_create_config");
    get(api->set_config, "duckdb_set_config");
    get(api->destroy_config, "duckdb_destroy_config");
    get(api->open_ext, "duckdb_open_ext");
    get(api->close, "duckdb_close");
    get(api->connect, "duckdb_connect");
    get(api->disconnect, "duckdb_disconnect");
    get(api->free, "duckdb_free");
    get(api->query, "duckdb_query");
    get(api->result_error, "duckdb_result_error");
    get(api->destroy_result, "duckdb_destroy_result");
    get(api->appender_create, "duckdb_appender_create");
    get(api->appender_close, "duckdb_appender_close");
    get(api->appender_destroy, "duckdb_appender_destroy");
    get(api->appender_end_row, "duckdb_appender_end_row");
    get(api->append_bool, "duckdb_append_bool");
    get(api->append_int32, "duckdb_append_int32");
    get(api->append_uint32, "duckdb_append_uint32");
    get(api->append_uint64, "duckdb_append_uint64");
    get(api->append_varchar_length, "duckdb_append_varchar_length");
    get(api->append_null, "duckdb_append_null");
    // Deprecated in later 1.x releases (for duckdb_appender_error_data):
    // used when there, else an appender's error is not described.
    api->appender_error =
        reinterpret_cast<duckdb_appender_error_fn>(::dlsym(handle, "duckdb_appender_error"));
    if (!missing.empty()) {
        ::dlclose(handle);
        throw std::runtime_error(path + " is not DuckDB's C library (it has no " + missing +
                                 "): " + kHowToGet);
    }
    const char* version = api->library_version();
    api->version = version ? version : "";
    if (major_version(api->version) < 1) {
        ::dlclose(handle);
        throw std::runtime_error("DuckDB " + api->version + " (" + path +
                                 ") is older than the 1.0 the Parquet export needs: " + kHowToGet);
    }
    loaded = std::move(api);
    return *loaded;
}

// --- Handles ---------------------------------------------------------------------

std::string sql_string(std::string_view text) {
    std::string out = "'";
    for (char c : text) {
        out += c;
        if (c == '\'') out += '\'';
    }
    return out + "'";
}

// An in-memory database and one connection to it; closed on destruction.
// DuckDB's memory for one export: enough for COPY's Parquet writers (64 MB
// is not, even on 2 threads; 256 MB is, with 16), far below the tables of a
// long trace (about 290 bytes an event when held in memory).
constexpr const char* kMemoryLimit = "256MB";

class Database {
  public:
    Database(const DuckDbApi& api, const std::string& temp_dir) : api_(api) {
        duckdb_config config = nullptr;
        if (api_.create_config(&config) != DuckDBSuccess) {
            api_.destroy_config(&config);
            throw std::runtime_error("DuckDB: cannot create a configuration");
        }
        // No extension is installed or loaded behind the user's back (the
        // Parquet writer is built into DuckDB's library). The tables hold
        // every event until COPY writes them: DuckDB's memory is capped
        // (kMemoryLimit) so that what does not fit spills into the export's
        // own staging directory, not into the current one, and the export's
        // memory does not grow with the trace.
        const std::pair<const char*, std::string> options[] = {
            {"autoinstall_known_extensions", "false"},
            {"autoload_known_extensions", "false"},
            {"temp_directory", temp_dir},
            {"memory_limit", kMemoryLimit},
        };
        for (const auto& [name, value] : options) {
            if (api_.set_config(config, name, value.c_str()) != DuckDBSuccess) {
                api_.destroy_config(&config);
                throw std::runtime_error(std::string("DuckDB ") + api_.version +
                                         " refused the setting " + name + " = " + value);
            }
        }
        char* error = nullptr;
        const duckdb_state opened = api_.open_ext(nullptr, &db_, config, &error);
        api_.destroy_config(&config);
        if (opened != DuckDBSuccess) {
            const std::string why = error ? error : "unknown error";
            if (error) api_.free(error);
            api_.close(&db_);
            throw std::runtime_error("DuckDB: cannot open an in-memory database: " + why);
        }
        if (api_.connect(db_, &con_) != DuckDBSuccess) {
            api_.disconnect(&con_);
            api_.close(&db_);
            throw std::runtime_error("DuckDB: cannot connect to its in-memory database");
        }
    }
    ~Database() {
        api_.disconnect(&con_);
        api_.close(&db_);
    }
    Database(const Database&) = delete;
    Database& operator=(const Database&) = delete;

    duckdb_connection connection() const noexcept { return con_; }

    // Runs `sql`; throws "DuckDB: <what>: <DuckDB's message>".
    void exec(const std::string& sql, const std::string& what) {
        duckdb_result result{};
        const duckdb_state state = api_.query(con_, sql.c_str(), &result);
        std::string why;
        if (state != DuckDBSuccess) {
            const char* e = api_.result_error(&result);
            why = e ? e : "unknown error";
        }
        api_.destroy_result(&result);
        if (state != DuckDBSuccess) throw std::runtime_error("DuckDB: " + what + ": " + why);
    }

  private:
    const DuckDbApi& api_;
    duckdb_database db_ = nullptr;
    duckdb_connection con_ = nullptr;
};

// Rows into one table, column by column in the table's order. Every failed
// call throws with DuckDB's message; the appender is destroyed (and what it
// still holds dropped) on destruction, written by close().
class Appender {
  public:
    Appender(const DuckDbApi& api, Database& db, const char* table) : api_(api), table_(table) {
        if (api_.appender_create(db.connection(), nullptr, table, &appender_) != DuckDBSuccess)
            fail();
    }
    ~Appender() { api_.appender_destroy(&appender_); }
    Appender(const Appender&) = delete;
    Appender& operator=(const Appender&) = delete;

    Appender& u64(uint64_t v) { return check(api_.append_uint64(appender_, v)); }
    Appender& u32(uint32_t v) { return check(api_.append_uint32(appender_, v)); }
    Appender& i32(int32_t v) { return check(api_.append_int32(appender_, v)); }
    Appender& boolean(bool v) { return check(api_.append_bool(appender_, v)); }
    Appender& text(std::string_view v) {
        return check(api_.append_varchar_length(appender_, v.data(), v.size()));
    }
    Appender& null() { return check(api_.append_null(appender_)); }
    // NULL where `v` is the "none" value.
    Appender& u64_or_null(uint64_t v, uint64_t none) { return v == none ? null() : u64(v); }
    Appender& u32_or_null(uint32_t v, uint32_t none) { return v == none ? null() : u32(v); }
    Appender& text_or_null(std::string_view v) { return v.empty() ? null() : text(v); }
    void end_row() {
        check(api_.appender_end_row(appender_));
        ++rows_;
    }
    uint64_t rows() const noexcept { return rows_; }
    // Writes the rows into the table.
    void close() { check(api_.appender_close(appender_)); }

  private:
    Appender& check(duckdb_state state) {
        if (state != DuckDBSuccess) fail();
        return *this;
    }
    [[noreturn]] void fail() {
        const char* e = appender_ && api_.appender_error ? api_.appender_error(appender_) : nullptr;
        throw std::runtime_error(std::string("DuckDB: cannot append to ") + table_ + ": " +
                                 (e ? e : "unknown error"));
    }

    const DuckDbApi& api_;
    const char* table_;
    duckdb_appender appender_ = nullptr;
    uint64_t rows_ = 0;
};

// --- The tables ------------------------------------------------------------------

// Each table's columns; run and rank (the partition keys) come first and
// are not stored in the files, whose directories name them
// (<table>/run=<run>/rank=<rank>/). docs/USAGE.md is the schema.
struct TableDef {
    const char* name;
    const char* columns;
};
constexpr TableDef kTables[] = {
    {"events",
     "run VARCHAR, rank INTEGER, pid UINTEGER, seq UBIGINT, t_ns UBIGINT, kind VARCHAR, "
     "pool VARCHAR, api VARCHAR, address UBIGINT, size UBIGINT, stream UBIGINT, device INTEGER, "
     "tid UINTEGER, step UBIGINT, layer VARCHAR, phase VARCHAR, stack_id UINTEGER, "
     "alloc_seq UBIGINT, free_seq UBIGINT, result INTEGER, note VARCHAR"},
    {"stacks",
     "run VARCHAR, rank INTEGER, pid UINTEGER, stack_id UINTEGER, depth UINTEGER, "
     "address UBIGINT, frame VARCHAR, function VARCHAR, file VARCHAR, line UINTEGER"},
    {"peak_live",
     "run VARCHAR, rank INTEGER, pid UINTEGER, pool VARCHAR, layer VARCHAR, phase VARCHAR, "
     "bytes UBIGINT, count UBIGINT"},
    {"ranks",
     "run VARCHAR, rank INTEGER, pid UINTEGER, trace VARCHAR, world_size INTEGER, "
     "tool_version VARCHAR, start_wall_ns UBIGINT, events UBIGINT, span_ns UBIGINT, "
     "steps UBIGINT, truncated BOOLEAN, owner_pool VARCHAR, peak_bytes UBIGINT, "
     "peak_seq UBIGINT, peak_t_ns UBIGINT, peak_step UBIGINT, peak_layer VARCHAR, "
     "peak_phase VARCHAR, live_bytes_at_exit UBIGINT"},
    {"findings",
     "run VARCHAR, rank INTEGER, pid UINTEGER, plugin VARCHAR, severity VARCHAR, basis VARCHAR, "
     "layer VARCHAR, phase VARCHAR, bytes UBIGINT, count UBIGINT, summary VARCHAR, "
     "evidence UINTEGER, stack_id UINTEGER, alloc_seq UBIGINT"},
};
enum Table { kEvents, kStacks, kPeakLive, kRanks, kFindings, kTableCount };

bool is_memory_event(EventKind k) {
    return k == EventKind::alloc || k == EventKind::free || k == EventKind::oom;
}

}  // namespace

struct ParquetExport::Impl {
    std::string shown;    // -o DIR as given, for messages
    std::string dir;      // where the dataset goes (absolute)
    std::string staging;  // the fresh sibling it is written in ("" once renamed)
    std::string temp;     // DuckDB's spill directory, inside staging
    const DuckDbApi* api = nullptr;
    std::unique_ptr<Database> db;
    Rows rows;
    uint64_t batches = 0;         // COPYs so far: names the files (part<batch>_<i>.parquet)
    std::string first_partition;  // the ranks table's first partition directory, relative

    ~Impl() {
        db.reset();  // DuckDB lets go of its files first
        if (!staging.empty()) {
            std::error_code ec;
            fs::remove_all(staging, ec);
        }
    }

    // Writes what `table` holds into its dataset and empties it.
    void flush(Table t) {
        const std::string name = kTables[t].name;
        db->exec("COPY " + name + " TO " + sql_string((fs::path(staging) / name).string()) +
                     " (FORMAT parquet, PARTITION_BY (run, rank), OVERWRITE_OR_IGNORE, "
                     "FILENAME_PATTERN 'part" +
                     std::to_string(batches) + "_{i}')",
                 "cannot write " + (fs::path(shown) / name).string());
        db->exec("DELETE FROM " + name, "cannot empty the table " + name);
        if (t == kRanks && first_partition.empty()) {
            std::error_code ec;
            for (auto it = fs::recursive_directory_iterator(fs::path(staging) / name, ec);
                 !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
                if (it->is_regular_file(ec)) {
                    first_partition =
                        fs::relative(it->path().parent_path(), fs::path(staging) / name, ec)
                            .string();
                    break;
                }
            }
        }
    }
};

ParquetExport::ParquetExport(std::string dir) : impl_(std::make_unique<Impl>()) {
    Impl& m = *impl_;
    m.api = &duckdb_api();  // first: without DuckDB nothing else matters

    std::error_code ec;
    if (dir.empty()) throw std::runtime_error("--format parquet needs -o DIR");
    const fs::path target = fs::absolute(dir, ec).lexically_normal();
    fs::path clean = target;
    if (clean.filename().empty()) clean = clean.parent_path();
    m.shown = dir;
    const fs::file_status st = fs::symlink_status(clean, ec);
    if (fs::exists(st)) {
        // An empty directory is replaced (rename(2) does it atomically);
        // anything else is kept: a run directory, a previous export, a file.
        if (!fs::is_directory(st) || !fs::is_empty(clean, ec) || ec) {
            throw std::runtime_error(
                "-o " + dir +
                " exists: the Parquet export writes a new directory and never "
                "writes into or over an existing one (remove it, or name another)");
        }
    }
    const fs::path parent = clean.parent_path();
    std::string error;
    if (!fs::is_directory(parent, ec) && !make_private_dirs(parent.string(), error))
        throw std::runtime_error("cannot write " + dir + ": " + error);
    // The dataset is written into a fresh 0700 sibling and renamed to DIR
    // when complete: a failed export leaves nothing at DIR.
    std::string pattern = clean.string() + ".tmp" + std::to_string(::getpid()) + ".XXXXXX";
    if (!::mkdtemp(pattern.data())) {
        const int err = errno;
        throw std::runtime_error("cannot write " + dir + ": " + std::strerror(err));
    }
    m.staging = pattern;
    m.dir = clean.string();
    m.temp = (fs::path(m.staging) / ".duckdb_tmp").string();
    m.db = std::make_unique<Database>(*m.api, m.temp);
    for (const TableDef& t : kTables)
        m.db->exec(std::string("CREATE TABLE ") + t.name + " (" + t.columns + ")",
                   std::string("cannot create the table ") + t.name);
}

ParquetExport::~ParquetExport() = default;

const ParquetExport::Rows& ParquetExport::rows() const noexcept {
    return impl_->rows;
}

std::string ParquetExport::library() const {
    return impl_->api->path + " " + impl_->api->version;
}

void ParquetExport::add(const std::string& run, const Trace& t, const TraceAnalysis& a,
                        const StackFrames& frames, const ExportProgress& progress) {
    TraceStream stream(t);
    add(run, stream, a, frames, progress);
}

void ParquetExport::add(const std::string& run, TraceStream& stream, const TraceAnalysis& a,
                        const StackFrames& frames, const ExportProgress& progress) {
    Impl& m = *impl_;
    const DuckDbApi& api = *m.api;
    const TraceTables& t = stream.tables();
    const int32_t rank = t.header.rank;
    const uint32_t pid = t.header.pid;
    const auto str = [&t](uint32_t id) -> const std::string& {
        static const std::string none;
        return id < t.strings.size() ? t.strings[id] : none;
    };

    // One pass: each event's row as it comes. Who freed what: a free's
    // allocation (alloc_seq) from the replay here; an allocation's free
    // (free_seq) comes later in the trace, so DuckDB fills it in from the
    // frees' alloc_seq once the rows are in. A range unmap frees several:
    // its row names the first one's allocation, and `more` keeps the
    // others' (alloc seq, free seq) for their rows.
    {
        Appender out(api, *m.db, "events");
        Replay replay;
        std::vector<std::pair<uint64_t, uint64_t>> more;
        const size_t n = stream.size();
        size_t i = 0;
        stream.for_each([&](const Event& e) {
            export_detail::report_progress(progress, i++, n);
            uint64_t alloc_seq = kNoSeq;
            replay.apply(e, [&](const LiveChange& c) {
                if (c.kind != LiveChange::Kind::free || c.outcome != FreeOutcome::freed) return;
                if (alloc_seq == kNoSeq)
                    alloc_seq = c.record.seq;
                else
                    more.emplace_back(c.record.seq, e.seq);
            });
            const bool memory = is_memory_event(e.kind);
            out.text(run).i32(rank).u32(pid).u64(e.seq).u64(e.t_ns).text(to_string(e.kind));
            if (memory)
                out.text(to_string(pool_of(e)));
            else
                out.null();
            if (e.api != Api::none)
                out.text(to_string(e.api));
            else
                out.null();
            if (memory || e.kind == EventKind::derived)
                out.u64(e.address);
            else
                out.null();
            if (memory) {
                out.u64(e.size);
                if (e.kind == EventKind::oom)
                    out.null();
                else
                    out.u64(e.stream);
                out.i32(e.device);
            } else {
                out.null().null().null();
            }
            out.u32(e.tid).u64(e.step).text(str(e.layer)).text(str(e.phase));
            out.u32_or_null(e.stack, 0);
            out.u64_or_null(alloc_seq, kNoSeq).null();  // free_seq: below
            if (memory)
                out.i32(e.result);
            else
                out.null();
            switch (e.kind) {
                case EventKind::mark:
                    out.text(str(e.aux));
                    break;
                case EventKind::derived:
                    out.text_or_null(str(uint32_t(e.stream)));
                    break;
                case EventKind::param:
                    if (e.aux < t.params.size())
                        out.text(str(t.params[e.aux].name));
                    else
                        out.null();
                    break;
                default:
                    out.null();
            }
            out.end_row();
        });
        export_detail::report_progress(progress, n, n);
        out.close();
        m.rows.events += out.rows();
        // The table holds this trace's events only (each add's are written
        // out and deleted), whose seqs are distinct.
        m.db->exec(
            "UPDATE events SET free_seq = f.s FROM (SELECT alloc_seq AS a, seq AS s FROM events "
            "WHERE alloc_seq IS NOT NULL) AS f WHERE events.seq = f.a",
            "cannot pair the allocations of " + t.path + " with their frees");
        for (size_t from = 0; from < more.size(); from += 1000) {
            std::string values;
            for (size_t k = from; k < std::min(more.size(), from + 1000); ++k)
                values += (k == from ? "(" : ", (") + std::to_string(more[k].first) + ", " +
                          std::to_string(more[k].second) + ")";
            m.db->exec("UPDATE events SET free_seq = v.s FROM (VALUES " + values +
                           ") AS v(a, s) WHERE events.seq = v.a",
                       "cannot pair the allocations of " + t.path + " with their frees");
        }
    }

    {
        Appender out(api, *m.db, "stacks");
        for (uint32_t id = 1; id < t.stacks.size(); ++id) {
            const std::vector<uint64_t>& addresses = t.stacks[id];
            const std::vector<ExportFrame>* named = id < frames.size() ? &frames[id] : nullptr;
            for (size_t d = 0; d < addresses.size(); ++d) {
                const ExportFrame* f = named && d < named->size() ? &(*named)[d] : nullptr;
                char hex[24];
                const auto [end, ec] = std::to_chars(hex + 2, hex + sizeof hex, addresses[d], 16);
                hex[0] = '0';
                hex[1] = 'x';
                const std::string_view raw(hex, size_t(end - hex));
                out.text(run).i32(rank).u32(pid).u32(id).u32(uint32_t(d)).u64(addresses[d]);
                out.text(f ? std::string_view(f->text) : raw);
                if (f) {
                    out.text(f->name).text_or_null(f->file).u32_or_null(f->line, 0);
                } else {
                    out.text(raw).null().null();
                }
                out.end_row();
            }
        }
        out.close();
        m.rows.stack_frames += out.rows();
    }

    {
        Appender out(api, *m.db, "peak_live");
        for (const TagStats& s : a.tags) {
            if (s.count_at_peak == 0) continue;
            out.text(run).i32(rank).u32(pid).text(to_string(a.owner)).text(s.layer).text(s.phase);
            out.u64(s.at_peak).u64(s.count_at_peak).end_row();
        }
        out.close();
        m.rows.peak_live += out.rows();
    }

    {
        Appender out(api, *m.db, "ranks");
        out.text(run).i32(rank).u32(pid).text(fs::path(t.path).filename().string());
        out.i32(t.header.world_size).text(t.header.tool_version).u64(t.header.start_wall_ns);
        out.u64(a.events).u64(a.span_ns).u64(a.steps).boolean(a.truncated);
        out.text(to_string(a.owner));
        if (const PoolSummary* p = a.pool(a.owner)) {
            out.u64(p->peak_bytes).u64(p->peak_seq).u64(p->peak_t_ns).u64(p->peak_step);
            out.text(p->peak_layer).text(p->peak_phase).u64(p->live_bytes_at_exit);
        } else {
            out.null().null().null().null().null().null().u64(0);
        }
        out.end_row();
        out.close();
        m.rows.traces += out.rows();
    }

    for (Table table : {kEvents, kStacks, kPeakLive, kRanks})
        m.flush(table);
    ++m.batches;
}

void ParquetExport::add_findings(const std::string& run, std::span<const Finding> findings) {
    if (findings.empty()) return;
    Impl& m = *impl_;
    {
        Appender out(*m.api, *m.db, "findings");
        for (const Finding& f : findings) {
            out.text(run).i32(f.rank).u32(f.pid).text(f.plugin).text(to_string(f.severity));
            out.text_or_null(f.basis).text(f.layer).text(f.phase).u64(f.bytes).u64(f.count);
            out.text(f.summary).u32(uint32_t(f.evidence.size()));
            if (f.evidence.empty()) {
                out.null().null();
            } else {
                out.u32_or_null(f.evidence.front().stack_id, 0).u64(f.evidence.front().alloc_seq);
            }
            out.end_row();
        }
        out.close();
        m.rows.findings += out.rows();
    }
    m.flush(kFindings);
    ++m.batches;
}

void ParquetExport::commit() {
    Impl& m = *impl_;
    if (m.staging.empty()) throw std::runtime_error("the Parquet export was already written");
    // A table without rows (a run without findings) still gets one file,
    // with no rows, in the first partition: readers then see its columns
    // and an empty result instead of a missing path.
    const uint64_t counts[kTableCount] = {m.rows.events, m.rows.stack_frames, m.rows.peak_live,
                                          m.rows.traces, m.rows.findings};
    for (int t = 0; t < kTableCount; ++t) {
        if (counts[t] != 0 || m.first_partition.empty()) continue;
        const fs::path where = fs::path(m.staging) / kTables[t].name / m.first_partition;
        std::error_code ec;
        fs::create_directories(where, ec);
        if (ec) {
            throw std::runtime_error("cannot write " +
                                     (fs::path(m.shown) / kTables[t].name).string() + ": " +
                                     ec.message());
        }
        m.db->exec(std::string("COPY (SELECT * EXCLUDE (run, rank) FROM ") + kTables[t].name +
                       ") TO " + sql_string((where / "part0_0.parquet").string()) +
                       " (FORMAT parquet)",
                   "cannot write " + (fs::path(m.shown) / kTables[t].name).string());
    }
    m.db.reset();
    std::error_code ec;
    fs::remove_all(m.temp, ec);
    if (::rename(m.staging.c_str(), m.dir.c_str()) != 0) {
        const int err = errno;
        throw std::runtime_error("cannot write " + m.shown + ": " +
                                 (err == EEXIST || err == ENOTEMPTY
                                      ? std::string("it was created while the export ran")
                                      : std::string(std::strerror(err))));
    }
    m.staging.clear();
}

}  // namespace allocscope
