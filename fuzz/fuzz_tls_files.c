/*
 * fuzz_tls_files.c - the TLS file loader (kv_tls_create: --tls-cert,
 * --tls-key, --tls-ca) on files holding the input, in a fresh directory:
 * the reader's checks and mbedtls's PEM, certificate and key parsers, as a
 * daemon or a client would meet them.
 *
 * Input: one control byte, then the bytes of the file. Control bits 0x03
 * choose the roles of the file: 0 the CA alone (a client without a
 * certificate); 1 the certificate, the key and the CA at once (a PEM bundle
 * holding all three works); 2 the CA with the input split at its first
 * "\n\n" into a certificate file and a key file; 3 as 1, but a daemon's
 * (need_cert).
 *
 * Checks: every failure has a one-line reason naming the file (or the flag)
 * and leaves the output untouched; a success gives a configuration that is
 * freed cleanly (leaks are reported by ASan).
 */
#include "common/err.h"
#include "common/tls.h"
#include "fuzz/fuzz_util.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char dir[256], a[300], b[300], c[300], err[512];
	kv_tls_files f = {0};
	kv_tls *t = NULL;
	unsigned mode;
	int rv;

	if (size < 1)
		return 0;
	mode = data[0] & 0x03u;
	data++;
	size--;
	fz_tmpdir(dir, sizeof(dir));
	snprintf(a, sizeof(a), "%s/a.pem", dir);
	snprintf(b, sizeof(b), "%s/b.pem", dir);
	snprintf(c, sizeof(c), "%s/c.pem", dir);
	fz_write_file(dir, "a.pem", data, size);
	f.ca = a;
	if (mode == 1 || mode == 3) {
		f.cert = a;
		f.key = a;
	} else if (mode == 2) {
		const uint8_t *cut = NULL;
		for (size_t i = 0; i + 1 < size && cut == NULL; i++)
			if (data[i] == '\n' && data[i + 1] == '\n')
				cut = data + i;
		size_t n = cut ? (size_t)(cut - data) : size;
		fz_write_file(dir, "b.pem", data, n);
		fz_write_file(dir, "c.pem", data + n, size - n);
		f.cert = b;
		f.key = c;
	}
	err[0] = 0;
	rv = kv_tls_create(&f, mode == 3, &t, err, sizeof(err));
	fz_rmdir(dir);
	FZ_CHECK(memchr(err, 0, sizeof(err)) != NULL);
	if (rv != KV_OK) {
		FZ_CHECK(rv < 0 && t == NULL);
		FZ_CHECK(err[0] != 0 && strchr(err, '\n') == NULL);
		FZ_CHECK(strstr(err, dir) != NULL || strstr(err, "--tls-") != NULL ||
		         rv == KV_ENOMEM);
		return 0;
	}
	FZ_CHECK(t != NULL);
	FZ_CHECK(kv_tls_has_cert(t) == (mode != 0));
	kv_tls_destroy(t);
	return 0;
}
