-- Evaluation of declarative partitioning of the journal's event table (docs/backends.md, "Partitioning").
-- Run on a scratch database:  psql -h 127.0.0.1 -U postgres -d <scratch> -f benchmarks/partition_eval.sql
-- Two copies of the event table's shape with N streams of 10 events spread over 400 days: `ev_plain` (as the
-- event table: unique (stream_id, seq)) and `ev_part` (monthly RANGE partitions on recorded_at, whose unique
-- index must include the partition key). Timed (\timing): removing the oldest month by DELETE vs by DETACH +
-- DROP, a stream's read (stream_id = ...) on each, and one-row appends on each.
\set streams 100000
\timing on
DROP TABLE IF EXISTS ev_plain, ev_part CASCADE;
CREATE TABLE ev_plain (id bigserial PRIMARY KEY, stream_id varchar(200) NOT NULL, seq bigint NOT NULL,
  type varchar(100) NOT NULL, payload jsonb NOT NULL, recorded_at timestamptz NOT NULL, UNIQUE (stream_id, seq));
CREATE TABLE ev_part (id bigserial, stream_id varchar(200) NOT NULL, seq bigint NOT NULL, type varchar(100) NOT NULL,
  payload jsonb NOT NULL, recorded_at timestamptz NOT NULL, UNIQUE (stream_id, seq, recorded_at))
  PARTITION BY RANGE (recorded_at);
SELECT format('CREATE TABLE ev_part_%s PARTITION OF ev_part FOR VALUES FROM (%L) TO (%L)', m,
              date_trunc('month', now()) - (m || ' months')::interval,
              date_trunc('month', now()) - ((m - 1) || ' months')::interval)
FROM generate_series(0, 14) m \gexec
INSERT INTO ev_plain (stream_id, seq, type, payload, recorded_at)
SELECT 's' || n, seq, 'BenchFilled', '{"data":"filled"}', now() - (n * 400.0 / :streams || ' days')::interval
FROM generate_series(0, :streams - 1) n, generate_series(0, 9) seq;
INSERT INTO ev_part (stream_id, seq, type, payload, recorded_at) SELECT stream_id, seq, type, payload, recorded_at FROM ev_plain;
VACUUM ANALYZE ev_plain;
VACUUM ANALYZE ev_part;
-- a stream's read: the journal's READ (stream_id = ..., no time: every partition's index is probed)
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, SUMMARY ON) SELECT * FROM ev_plain WHERE stream_id = 's77777' ORDER BY seq;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, SUMMARY ON) SELECT * FROM ev_part WHERE stream_id = 's77777' ORDER BY seq;
-- the oldest whole month: its rows by DELETE, or its partition detached and dropped
SELECT count(*) AS oldest_month_rows FROM ev_part_14;
DELETE FROM ev_plain WHERE recorded_at < date_trunc('month', now()) - '13 months'::interval;
ALTER TABLE ev_part DETACH PARTITION ev_part_14;
DROP TABLE ev_part_14;
-- one-row appends (10,000 each), statement-level tip + 1 as the journal does
DO $$ BEGIN FOR i IN 1..10000 LOOP
  INSERT INTO ev_plain (stream_id, seq, type, payload, recorded_at) VALUES ('new' || i, 0, 'E', '{}', now());
END LOOP; END $$;
DO $$ BEGIN FOR i IN 1..10000 LOOP
  INSERT INTO ev_part (stream_id, seq, type, payload, recorded_at) VALUES ('new' || i, 0, 'E', '{}', now());
END LOOP; END $$;
-- the guarantee partitioning loses: the same (stream_id, seq) twice, accepted by ev_part
INSERT INTO ev_part (stream_id, seq, type, payload, recorded_at) VALUES ('dup', 0, 'E', '{}', now()),
  ('dup', 0, 'E', '{}', now() - interval '1 second');
SELECT count(*) AS duplicate_seq_rows_accepted FROM ev_part WHERE stream_id = 'dup';
DROP TABLE ev_plain, ev_part CASCADE;
