/*
 * log.h - one line per event on stderr: `ts level component msg key=value...`.
 *
 * The first four fields are positional (msg is a fixed phrase of the code and
 * may hold spaces; control characters, quotes and `=` in it are replaced);
 * the key=value pairs that follow are logfmt: a value is written bare when
 * it is made of printable characters other than space, `=` and `"`, and
 * otherwise quoted, with `"` and `\` escaped as `\"` and `\\`, newline, tab
 * and carriage return as `\n`, `\t` and `\r`, and any other control byte as
 * `\u00XX` (doc/operations.md, "Logs"). Callers write `key=%s` or
 * `key="%s"` in kvfmt: whatever the arguments hold, the pairs stay
 * parseable.
 *
 * ts is RFC 3339 UTC with microseconds. The level threshold is set once at
 * start-up (before threads start); logging itself is thread-safe because each
 * line is formatted into a local buffer and written with one write(2).
 */
#ifndef KV_COMMON_LOG_H
#define KV_COMMON_LOG_H

#include <stdarg.h>
#include <stddef.h>

enum kv_log_level { KV_LOG_DEBUG = 0, KV_LOG_INFO, KV_LOG_WARN, KV_LOG_ERROR, KV_LOG_OFF };

/* Sets the lowest level that is printed. Call before starting threads. */
void kv_log_set_level(enum kv_log_level level);

/* Parses "debug", "info", "warn", "error" or "off". Returns 0 or KV_EINVAL. */
int kv_log_parse_level(const char *s, enum kv_log_level *out);

/* Returns whether a line at `level` would be printed. */
int kv_log_enabled(enum kv_log_level level);

/*
 * Names the calling thread for `top -H`, `ps -L`, perf and gdb (the
 * kernel keeps 15 bytes: longer names are cut). Every long-lived thread of
 * the daemons and the client library calls it first; the names are listed
 * in doc/threads.md.
 */
void kv_log_thread_name(const char *name);

/*
 * Writes one line. `msg` is a short lowercase phrase; `kvfmt` (may be NULL)
 * formats the trailing `key=value` pairs. Lines longer than 4 KiB are cut.
 */
void kv_log(enum kv_log_level level, const char *component, const char *msg, const char *kvfmt, ...)
    __attribute__((format(printf, 4, 5)));

/*
 * Formats the key=value pairs of kvfmt and ap as kv_log() writes them
 * (logfmt, see above) into out (cap bytes, NUL-terminated; a value that does
 * not fit is cut and its quote closed). The pairs are found in kvfmt: a pair
 * is `key=VALUE` where VALUE is text and conversions up to the next space of
 * kvfmt, or `key="..."` up to the closing quote of kvfmt; what a conversion
 * prints is always value text (its spaces, quotes and `=` included). Returns
 * the length written.
 */
size_t kv_log_format_kv(char *out, size_t cap, const char *kvfmt, va_list ap);

#define KV_DEBUG(comp, msg, ...) kv_log(KV_LOG_DEBUG, comp, msg, __VA_ARGS__)
#define KV_INFO(comp, msg, ...)  kv_log(KV_LOG_INFO, comp, msg, __VA_ARGS__)
#define KV_WARN(comp, msg, ...)  kv_log(KV_LOG_WARN, comp, msg, __VA_ARGS__)
#define KV_ERROR(comp, msg, ...) kv_log(KV_LOG_ERROR, comp, msg, __VA_ARGS__)

#endif
