// Runs SQL on a Parquet export with DuckDB through Node (@duckdb/node-api),
// for tests/python/parquet_export_test.py: a real engine reading what
// `allocscope export --format parquet` wrote, independently of allocscope's
// own DuckDB library calls.
//
//   node parquet_query.mjs DEPS_DIR < '{"setup": [SQL...], "queries": {"name": SQL}}'
//
// DEPS_DIR holds node_modules/@duckdb/node-api (tools/setup-deps --tests
// installs it there). Prints {"name": [row objects]} as JSON, integers as
// strings (DuckDB's BIGINT / UBIGINT do not fit JavaScript numbers).
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

const deps = process.argv[2];
if (!deps) {
  process.stderr.write('usage: node parquet_query.mjs DEPS_DIR < queries.json\n');
  process.exit(2);
}
const require = createRequire(join(deps, 'package.json'));
const { DuckDBInstance } = require('@duckdb/node-api');

const request = JSON.parse(readFileSync(0, 'utf8'));
const instance = await DuckDBInstance.create(':memory:');
const connection = await instance.connect();
for (const sql of request.setup ?? []) await connection.run(sql);
const out = {};
for (const [name, sql] of Object.entries(request.queries ?? {})) {
  const reader = await connection.runAndReadAll(sql);
  out[name] = reader.getRowObjectsJson();
}
process.stdout.write(JSON.stringify(out));
