#!/bin/sh
# tls_certs.sh DIR - makes a throw-away PKI for the TLS tests in DIR (created):
#   ca.crt/ca.key          the cluster's CA
#   server.crt/server.key  the daemons' certificate (CN and IP SAN 127.0.0.1)
#   client.crt/client.key  a client certificate signed by ca
#   otherca.crt            another CA
#   rogue.crt/rogue.key    a certificate signed by otherca (usable as client
#                          or server certificate)
# Every certificate is EC P-256 and valid for two days. Needs openssl.
set -eu
d=$1
mkdir -p "$d"
cd "$d"
quiet() { "$@" >/dev/null 2>&1 || { echo "tls_certs.sh: failed: $*" >&2; exit 1; }; }
ca() { # NAME
	quiet openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
		-days 2 -subj "/CN=shardkv test $1" -keyout "$1.key" -out "$1.crt"
}
leaf() { # NAME CA CN SAN
	quiet openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
		-subj "/CN=$3" -keyout "$1.key" -out "$1.csr"
	printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n' \
		"$4" >"$1.ext"
	quiet openssl x509 -req -in "$1.csr" -CA "$2.crt" -CAkey "$2.key" -CAcreateserial \
		-days 2 -extfile "$1.ext" -out "$1.crt"
	rm -f "$1.csr" "$1.ext"
}
ca ca
ca otherca
leaf server ca 127.0.0.1 "IP:127.0.0.1,DNS:localhost"
leaf client ca client "DNS:client"
leaf rogue otherca 127.0.0.1 "IP:127.0.0.1,DNS:localhost"
chmod 600 ./*.key
