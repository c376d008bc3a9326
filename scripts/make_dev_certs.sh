#!/usr/bin/env bash
# Makes a private CA and certificates for running LazyKV with TLS and mutual TLS on one
# machine or a test cluster (README "Security"), plus a tokens file with one token per role.
#
#   scripts/make_dev_certs.sh DIR [NAME...]
#
# DIR/ca.pem                 the CA (give it to clients as --tls-ca, to servers as --tls-client-ca)
# DIR/server.pem, server.key a server certificate for localhost, 127.0.0.1 and each NAME
#                            (a DNS name or an IP address)
# DIR/client.pem, client.key a client certificate (common name "lazykv-client") for mutual TLS
# DIR/tokens                 "TOKEN NAME ROLE" lines for --auth-tokens
# DIR/{client,worker,admin}.token  each role's token, for --auth-token / --cache-auth-token
# Keys are ECDSA P-256, readable by this user only; certificates last 30 days. Existing
# files are replaced. For production, use your own CA (cert-manager, Vault, ...).
set -euo pipefail
dir=${1:?usage: make_dev_certs.sh DIR [NAME...]}
shift
mkdir -p "$dir"
umask 077
cd "$dir"

san="DNS:localhost,IP:127.0.0.1"
for name in "$@"; do
  if [[ $name =~ ^[0-9.]+$ || $name == *:* ]]; then san+=",IP:$name"; else san+=",DNS:$name"; fi
done

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

key ca.key
openssl req -x509 -new -key ca.key -sha256 -days 30 -subj "/CN=lazykv-dev-ca" -out ca.pem \
  -addext "basicConstraints=critical,CA:true" -addext "keyUsage=critical,keyCertSign,cRLSign"

issue() {  # NAME CN EXTENSIONS
  key "$1.key"
  openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 -sha256 \
    -extfile <(printf '%s\n' "$3") -out "$1.pem" 2>/dev/null
  rm -f "$1.csr"
}
issue server lazykv-server "subjectAltName=$san
extendedKeyUsage=serverAuth"
issue client lazykv-client "extendedKeyUsage=clientAuth"

: > tokens
for role in client worker admin; do
  token=$(openssl rand -hex 32)
  echo "$token" > "$role.token"
  echo "$token dev-$role $role" >> tokens
done
chmod 600 ./*.key ./*.token tokens
chmod 644 ./*.pem
echo "made ca.pem, server.{pem,key}, client.{pem,key}, tokens and {client,worker,admin}.token in $(pwd)"
