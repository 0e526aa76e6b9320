#!/usr/bin/env bash
# Make a small private CA and TLS certificates for kvpool, with nothing but
# the openssl command-line tool. For tests and small sites only: a real site
# issues these from its own PKI.
#
#   deploy/make-certs.sh DIR [CLIENT_CN ...]      (default client: admin)
#
# Makes in DIR (keys mode 0600; EC P-256, SHA-256):
#   ca.crt ca.key          self-signed CA, 3650 days, CN $KVPOOL_CA_CN or "kvpool test CA"
#   server.crt server.key  CN kvpool-master, serverAuth+clientAuth (kvpool serve
#                          uses it towards the master too), 825 days, SAN
#                          DNS:localhost,IP:127.0.0.1 plus $KVPOOL_SERVER_SAN
#                          (openssl form: "DNS:master.example,IP:10.0.0.1")
#   CN.crt CN.key          one client cert (clientAuth) per CLIENT_CN, 825 days
#   crl.pem                the CA's CRL, 30 days, re-signed on every run
#   .ca/                   the openssl ca config and database (index, serials)
# With KVPOOL_TEST_CERTS=1, also certs for hostile-case tests:
#   expired.crt/.key       CN expired, valid only 2020-01-01..02
#   revoked.crt/.key       CN revoked, revoked and listed in crl.pem
#   rogue-ca.crt/.key      another self-signed CA
#   rogue.crt/.key         CN admin, issued by the rogue CA
# If DIR/ca.crt exists the CA is reused and only missing files are made (delete
# a leaf's .crt to reissue it). To revoke a cert later:
#   openssl ca -config DIR/.ca/openssl.cnf -revoke DIR/NAME.crt
#   deploy/make-certs.sh DIR          (re-signs crl.pem)
set -euo pipefail

die() { echo "make-certs: $*" >&2; exit "${rc:-1}"; }
if [ $# -lt 1 ] || [ -z "$1" ] || [ "${1#-}" != "$1" ]; then rc=2 die "usage: deploy/make-certs.sh DIR [CLIENT_CN ...]"; fi
command -v openssl >/dev/null || die "openssl not found"
DIR=$1; shift
CLIENTS=("${@:-admin}")
CA_CN=${KVPOOL_CA_CN:-kvpool test CA}
SAN="DNS:localhost,IP:127.0.0.1${KVPOOL_SERVER_SAN:+,$KVPOOL_SERVER_SAN}"
for cn in "${CLIENTS[@]}"; do
  [[ $cn =~ ^[A-Za-z0-9][A-Za-z0-9._@-]*$ ]] || rc=2 die "bad client CN '$cn'"
  case $cn in ca|server|crl|expired|revoked|rogue|rogue-ca) rc=2 die "client CN '$cn' clashes with a file made here" ;; esac
done
[[ $CA_CN =~ ^[^/$'\n'\\]+$ ]] || rc=2 die "bad KVPOOL_CA_CN"
[[ $SAN =~ ^[A-Za-z0-9:.,*_@\ -]+$ ]] || rc=2 die "bad KVPOOL_SERVER_SAN"

mkdir -p "$DIR"; DIR=$(cd "$DIR" && pwd)
[[ $DIR != *[\$#\"\'\\$'\n']* ]] || rc=2 die "DIR must not contain \$ # quotes backslashes or newlines"
CADB=$DIR/.ca CNF=$DIR/.ca/openssl.cnf
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
cd "$DIR"
made() { for f in "$@"; do echo "make-certs: made $DIR/$f" >&2; done; }
ossl() {  # openssl, quiet; its output is shown only if it fails
  openssl "$@" >"$TMP/log" 2>&1 || { cat "$TMP/log" >&2; die "openssl $1 failed"; }
}
newkey() {  # FILE: a fresh P-256 private key, mode 0600
  rm -f "$1"
  (umask 077; ossl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1")
  chmod 600 "$1"
}
csr() { newkey "$1.key"; ossl req -new -config "$CNF" -key "$1.key" -subj "/CN=$2" -out "$TMP/$1.csr"; }
selfsign() {  # NAME CN: a self-signed CA, 3650 days
  newkey "$1.key"
  ossl req -new -x509 -config "$CNF" -key "$1.key" -subj "/CN=$2" -days 3650 -sha256 \
    -extensions ca_ext -set_serial "0x$(openssl rand -hex 16)" -out "$1.crt"
  made "$1.crt" "$1.key"
}
issue() {  # NAME CN EXT [openssl ca options]: NAME.key + NAME.crt from our CA
  local name=$1 cn=$2 ext=$3; shift 3
  csr "$name" "$cn"
  ossl ca -batch -config "$CNF" -notext -extensions "$ext" -in "$TMP/$name.csr" -out "$name.crt" "$@"
  made "$name.crt" "$name.key"
}
missing() { [ ! -s "$1.crt" ] || [ ! -s "$1.key" ]; }
# The openssl ca config is rewritten every run (it holds no state); the
# database files next to it are created once and kept.
mkdir -p "$CADB/newcerts"
cat >"$CNF" <<EOF
[ ca ]
default_ca = kvpool_ca
[ kvpool_ca ]
dir = $CADB
database = \$dir/index.txt
serial = \$dir/serial
crlnumber = \$dir/crlnumber
new_certs_dir = \$dir/newcerts
certificate = $DIR/ca.crt
private_key = $DIR/ca.key
default_md = sha256
policy = kvpool_policy
unique_subject = no
crl_extensions = crl_ext
[ kvpool_policy ]
commonName = supplied
[ req ]
distinguished_name = req_dn
[ req_dn ]
[ ca_ext ]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
[ server_ext ]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth,clientAuth
subjectAltName = $SAN
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[ client_ext ]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[ crl_ext ]
authorityKeyIdentifier = keyid
EOF
[ -f "$CADB/index.txt" ] || : >"$CADB/index.txt"
[ -s "$CADB/serial" ] || openssl rand -hex 16 >"$CADB/serial"
[ -s "$CADB/crlnumber" ] || echo 1000 >"$CADB/crlnumber"

if [ -s ca.crt ]; then
  [ -s ca.key ] || die "$DIR/ca.crt exists but ca.key is missing"
  echo "make-certs: reusing CA $DIR/ca.crt" >&2
else
  selfsign ca "$CA_CN"
fi

fresh=(server.crt)  # leaves to check against the CRL: server + those made now
if missing server; then issue server kvpool-master server_ext -days 825; fi
for cn in "${CLIENTS[@]}"; do
  if missing "$cn"; then issue "$cn" "$cn" client_ext -days 825; fresh+=("$cn.crt"); fi
done

if [ "${KVPOOL_TEST_CERTS:-0}" = 1 ]; then
  if missing expired; then issue expired expired client_ext -startdate 20200101000000Z -enddate 20200102000000Z; fi
  if missing revoked; then
    issue revoked revoked client_ext -days 825
    ossl ca -config "$CNF" -revoke revoked.crt -crl_reason keyCompromise
  fi
  if missing rogue-ca; then selfsign rogue-ca "kvpool rogue CA"; rm -f rogue.crt; fi
  if missing rogue; then  # same CN as a real principal, from an unknown CA
    csr rogue admin
    ossl x509 -req -in "$TMP/rogue.csr" -CA rogue-ca.crt -CAkey rogue-ca.key -days 825 -sha256 \
      -set_serial "0x$(openssl rand -hex 16)" -extfile "$CNF" -extensions client_ext -out rogue.crt
    made rogue.crt rogue.key
  fi
fi

ossl ca -config "$CNF" -gencrl -crldays 30 -out crl.pem
made crl.pem

# Check what we made; any surprise is an error. (Certs revoked later by hand
# still chain to the CA; only the ones made now are checked against the CRL.)
openssl verify -CAfile ca.crt server.crt "${CLIENTS[@]/%/.crt}" >&2
openssl verify -CAfile ca.crt -crl_check -CRLfile crl.pem "${fresh[@]}" | sed 's/: OK$/: OK (not revoked)/' >&2
if [ -s revoked.crt ]; then
  out=$(openssl verify -CAfile ca.crt -crl_check -CRLfile crl.pem revoked.crt 2>&1) &&
    die "revoked.crt still verifies against crl.pem"
  grep -q 'certificate revoked' <<<"$out" || die "revoked.crt: unexpected failure: $out"
  echo "revoked.crt: rejected (certificate revoked, listed in crl.pem)" >&2
fi
if [ -s expired.crt ]; then
  ! openssl x509 -in expired.crt -noout -checkend 0 >/dev/null || die "expired.crt is not expired"
  echo "expired.crt: expired" >&2
fi
