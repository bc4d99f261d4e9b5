// The part of DuckDB's stable C API (duckdb.h of DuckDB 1.x) that the
// Parquet export uses, declared here so that allocscope builds without
// DuckDB: libduckdb.so is opened at run time (analyze/export_parquet.cpp,
// DuckDb::load). Only opaque handles, the result struct (which duckdb_query
// fills in place, so its size must be exact) and functions that take and
// return plain values: no struct internals are read.
//
// The declarations follow duckdb.h; names keep DuckDB's spelling so they can
// be checked against it line by line.
#pragma once

#include <cstdint>

namespace allocscope::duckdb_c {

using idx_t = uint64_t;

// duckdb_state
enum duckdb_state : int { DuckDBSuccess = 0, DuckDBError = 1 };

// Opaque handles: in duckdb.h each is a pointer to a struct holding one
// pointer (`typedef struct _duckdb_database { void *internal_ptr; } *
// duckdb_database;`).
struct _duckdb_database {
    void* internal_ptr;
};
struct _duckdb_connection {
    void* internal_ptr;
};
struct _duckdb_appender {
    void* internal_ptr;
};
struct _duckdb_config {
    void* internal_ptr;
};
using duckdb_database = _duckdb_database*;
using duckdb_connection = _duckdb_connection*;
using duckdb_appender = _duckdb_appender*;
using duckdb_config = _duckdb_config*;

// duckdb_result: filled in by duckdb_query, read only through
// duckdb_result_error and released by duckdb_destroy_result. Since DuckDB
// 0.3.2 (DUCKDB_API_VERSION 2, the only one of 1.x) it is five deprecated
// fields and the internal pointer: 48 bytes on 64-bit targets.
struct duckdb_result {
    idx_t deprecated_column_count;
    idx_t deprecated_row_count;
    idx_t deprecated_rows_changed;
    void* deprecated_columns;
    char* deprecated_error_message;
    void* internal_data;
};
static_assert(sizeof(void*) != 8 || sizeof(duckdb_result) == 48,
              "duckdb_result must match duckdb.h's layout");

// The functions, as pointer types (resolved with dlsym).
extern "C" {
using duckdb_library_version_fn = const char* (*)();
using duckdb_create_config_fn = duckdb_state (*)(duckdb_config* out_config);
using duckdb_set_config_fn = duckdb_state (*)(duckdb_config config, const char* name,
                                              const char* option);
using duckdb_destroy_config_fn = void (*)(duckdb_config* config);
using duckdb_open_ext_fn = duckdb_state (*)(const char* path, duckdb_database* out_database,
                                            duckdb_config config, char** out_error);
using duckdb_close_fn = void (*)(duckdb_database* database);
using duckdb_connect_fn = duckdb_state (*)(duckdb_database database,
                                           duckdb_connection* out_connection);
using duckdb_disconnect_fn = void (*)(duckdb_connection* connection);
using duckdb_free_fn = void (*)(void* ptr);

using duckdb_query_fn = duckdb_state (*)(duckdb_connection connection, const char* query,
                                         duckdb_result* out_result);
using duckdb_result_error_fn = const char* (*)(duckdb_result* result);
using duckdb_destroy_result_fn = void (*)(duckdb_result* result);

using duckdb_appender_create_fn = duckdb_state (*)(duckdb_connection connection, const char* schema,
                                                   const char* table,
                                                   duckdb_appender* out_appender);
using duckdb_appender_error_fn = const char* (*)(duckdb_appender appender);
using duckdb_appender_close_fn = duckdb_state (*)(duckdb_appender appender);
using duckdb_appender_destroy_fn = duckdb_state (*)(duckdb_appender* appender);
using duckdb_appender_end_row_fn = duckdb_state (*)(duckdb_appender appender);
using duckdb_append_bool_fn = duckdb_state (*)(duckdb_appender appender, bool value);
using duckdb_append_int32_fn = duckdb_state (*)(duckdb_appender appender, int32_t value);
using duckdb_append_uint32_fn = duckdb_state (*)(duckdb_appender appender, uint32_t value);
using duckdb_append_uint64_fn = duckdb_state (*)(duckdb_appender appender, uint64_t value);
using duckdb_append_varchar_length_fn = duckdb_state (*)(duckdb_appender appender, const char* val,
                                                         idx_t length);
using duckdb_append_null_fn = duckdb_state (*)(duckdb_appender appender);
}

}  // namespace allocscope::duckdb_c
