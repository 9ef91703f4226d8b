/*
 * fuzz_auth_token.c - the shared secret's file reader (kv_auth_load,
 * --auth-token-file) on a file holding the input, in a fresh directory, and
 * the token check (kv_auth_ok) with what it loaded.
 *
 * Input: the bytes of the file.
 *
 * Checks: a load fails exactly when the file is empty (after one trailing
 * "\n" or "\r\n" is cut) or longer than KV_AUTH_MAX_TOKEN, always with a
 * reason, and leaves the output untouched; a successful load returns those
 * bytes; the secret accepts itself and refuses itself with one byte
 * changed, one byte more or one byte less.
 */
#include "common/auth.h"
#include "common/err.h"
#include "common/key.h"
#include "fuzz/fuzz_util.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char dir[256], path[300], err[512];
	kv_buf tok = {0};
	bool loose = true;
	size_t want = size;
	uint8_t *other;
	int rv;

	if (want > 0 && data[want - 1] == '\n') {
		want--;
		if (want > 0 && data[want - 1] == '\r')
			want--;
	}
	fz_tmpdir(dir, sizeof(dir));
	fz_write_file(dir, "token", data, size);
	snprintf(path, sizeof(path), "%s/token", dir);
	err[0] = 0;
	rv = kv_auth_load(path, &tok, &loose, err, sizeof(err));
	fz_rmdir(dir);
	FZ_CHECK(memchr(err, 0, sizeof(err)) != NULL);
	if (want == 0 || want > KV_AUTH_MAX_TOKEN) {
		FZ_CHECK(rv == (want == 0 ? KV_EINVAL : KV_ETOOBIG));
		FZ_CHECK(err[0] != 0 && strstr(err, path) != NULL);
		FZ_CHECK(tok.data == NULL && tok.len == 0);
		return 0;
	}
	FZ_CHECK(rv == KV_OK);
	FZ_CHECK(tok.len == want && memcmp(tok.data, data, want) == 0);
	FZ_CHECK(kv_auth_ok(&tok, data, want));
	FZ_CHECK((other = malloc(want + 1)) != NULL);
	memcpy(other, data, want);
	other[want] = 'x';
	FZ_CHECK(!kv_auth_ok(&tok, other, want + 1));
	FZ_CHECK(!kv_auth_ok(&tok, data, want - 1));
	other[want / 2] ^= 0x01;
	FZ_CHECK(!kv_auth_ok(&tok, other, want));
	FZ_CHECK(!kv_auth_ok(&tok, NULL, 0));
	free(other);
	kv_buf_fini(&tok);
	return 0;
}
