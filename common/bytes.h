/*
 * bytes.h - integer encoding for on-disk and wire formats.
 *
 * kv_putN stores an N-bit value at p in little-endian byte order; kv_getN
 * loads one. kv_put64be and kv_get64be do the same in big-endian (network)
 * order (and kv_put32be, kv_get32be), for nng's framing (common/rpc_tcp.c,
 * common/rpc_link.c). p needs no alignment. These are byte-by-byte so that
 * they are correct on any host and cannot trip alignment or aliasing rules; compilers turn them
 * into single loads and stores.
 */
#ifndef KV_COMMON_BYTES_H
#define KV_COMMON_BYTES_H

#include <stdint.h>

static inline void
kv_put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static inline void
kv_put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static inline void
kv_put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint16_t
kv_get16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (p[1] << 8));
}

static inline uint32_t
kv_get32(const uint8_t *p)
{
	uint32_t v = 0;
	for (int i = 3; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static inline uint64_t
kv_get64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static inline void
kv_put64be(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (56 - 8 * i));
}

static inline void
kv_put32be(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (24 - 8 * i));
}

static inline uint32_t
kv_get32be(const uint8_t *p)
{
	uint32_t v = 0;
	for (int i = 0; i < 4; i++)
		v = (v << 8) | p[i];
	return v;
}

static inline uint64_t
kv_get64be(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v = (v << 8) | p[i];
	return v;
}

#endif
