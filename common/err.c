/*
 * err.c - messages and foreign-code translation for the KV_E* table.
 */
#include "common/err.h"

#include <errno.h>
#include <nng/nng.h>

const char *
kv_strerror(int err)
{
	switch (err) {
	case KV_OK:
		return "success";
#define KV__ERR_MSG(name, value, msg)                                                              \
	case KV_E##name:                                                                           \
		return msg;
		KV_ERR_MAP(KV__ERR_MSG)
#undef KV__ERR_MSG
	default:
		return "unknown error";
	}
}

const char *
kv_errname(int err)
{
	switch (err) {
	case KV_OK:
		return "OK";
#define KV__ERR_NAME(name, value, msg)                                                             \
	case KV_E##name:                                                                           \
		return "E" #name;
		KV_ERR_MAP(KV__ERR_NAME)
#undef KV__ERR_NAME
	default:
		return "EUNKNOWN";
	}
}

int
kv_err_from_errno(int e)
{
	switch (e) {
	case 0:
		return KV_OK;
	case ENOENT:
		return KV_ENOTFOUND;
	case EINVAL:
		return KV_EINVAL;
	case ENOMEM:
		return KV_ENOMEM;
	case ETIMEDOUT:
		return KV_ETIMEDOUT;
	case EEXIST:
		return KV_EEXISTS;
	case EACCES:
	case EPERM:
	case EROFS:
		return KV_EPERM;
	case ENOSPC:
	case EDQUOT:
		return KV_ENOSPC;
	case EADDRINUSE:
		return KV_EADDRINUSE;
	case EBUSY:
	case EAGAIN:
		return KV_EBUSY;
	case EIO:
		return KV_EIO;
	default:
		return KV_EIO;
	}
}

int
kv_err_from_nng(int rv)
{
	switch (rv) {
	case 0:
		return KV_OK;
	case NNG_ETIMEDOUT:
		return KV_ETIMEDOUT;
	case NNG_ECLOSED:
	case NNG_ECANCELED:
		return KV_ECLOSED;
	case NNG_ENOMEM:
		return KV_ENOMEM;
	case NNG_EADDRINUSE:
		return KV_EADDRINUSE;
	case NNG_EINVAL:
	case NNG_EADDRINVAL:
	case NNG_ENOTSUP:
	case NNG_EBADTYPE:
		return KV_EINVAL;
	case NNG_ECONNREFUSED:
	case NNG_ECONNRESET:
	case NNG_ECONNSHUT:
	case NNG_EUNREACHABLE:
	case NNG_ECONNABORTED:
	case NNG_ESTATE:
		return KV_EUNAVAIL;
	case NNG_EMSGSIZE:
		return KV_ELIMIT;
	case NNG_EPERM:
	case NNG_EPEERAUTH:
	case NNG_ECRYPTO:
		return KV_EAUTH;
	default:
		return KV_EIO;
	}
}
