/*
 * log.h - one line per event on stderr: `ts level component msg key=value...`.
 *
 * ts is RFC 3339 UTC with microseconds. The level threshold is set once at
 * start-up (before threads start); logging itself is thread-safe because each
 * line is formatted into a local buffer and written with one write(2).
 */
#ifndef KV_COMMON_LOG_H
#define KV_COMMON_LOG_H

enum kv_log_level { KV_LOG_DEBUG = 0, KV_LOG_INFO, KV_LOG_WARN, KV_LOG_ERROR, KV_LOG_OFF };

/* Sets the lowest level that is printed. Call before starting threads. */
void kv_log_set_level(enum kv_log_level level);

/* Parses "debug", "info", "warn", "error" or "off". Returns 0 or KV_EINVAL. */
int kv_log_parse_level(const char *s, enum kv_log_level *out);

/* Returns whether a line at `level` would be printed. */
int kv_log_enabled(enum kv_log_level level);

/*
 * Writes one line. `msg` is a short lowercase phrase; `kvfmt` (may be NULL)
 * formats the trailing `key=value` pairs. Lines longer than 4 KiB are cut.
 */
void kv_log(enum kv_log_level level, const char *component, const char *msg, const char *kvfmt, ...)
    __attribute__((format(printf, 4, 5)));

#define KV_DEBUG(comp, msg, ...) kv_log(KV_LOG_DEBUG, comp, msg, __VA_ARGS__)
#define KV_INFO(comp, msg, ...)  kv_log(KV_LOG_INFO, comp, msg, __VA_ARGS__)
#define KV_WARN(comp, msg, ...)  kv_log(KV_LOG_WARN, comp, msg, __VA_ARGS__)
#define KV_ERROR(comp, msg, ...) kv_log(KV_LOG_ERROR, comp, msg, __VA_ARGS__)

#endif
