#!/usr/bin/env bash
# test_tls.sh - kexd serving TLS (--tls-cert/--tls-key) and mutual TLS
# (--tls-client-ca), against the Python stubs, the kex Python package and the
# kex CLI.  A CA, a server certificate for 127.0.0.1 and localhost, a client
# certificate and one from another CA are made with openssl in $tmp.
#
# Env: KEX_BUILD_DIR (default build).  The last line of the output is
# "N passed, N failed"; exit 1 on any failure.
. "$(dirname "$0")/lib.bash"
kex=$build/kex
probe="$PY tests/integration/test_tls.py"
addr="127.0.0.1:$port"
export KEX_STUBS="$tmp"
command -v openssl >/dev/null || { bad "openssl is installed"; finish; }
[ -x "$kex" ] || { bad "kex is built ($kex)"; finish; }

# ---- certificates ----
# ca NAME: a self-signed CA in $tmp/NAME.pem / NAME.key
ca() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj "/CN=kex test $1" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    -keyout "$tmp/$1.key" -out "$tmp/$1.pem" 2>>"$tmp/openssl.log"
}
# leaf NAME CA CN EXT: a key and a certificate signed by CA, with the extensions EXT
leaf() {
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$3" \
    -keyout "$tmp/$1.key" -out "$tmp/$1.csr" 2>>"$tmp/openssl.log" &&
    printf '%s\n' "$4" >"$tmp/$1.ext" &&
    openssl x509 -req -in "$tmp/$1.csr" -CA "$tmp/$2.pem" -CAkey "$tmp/$2.key" -CAcreateserial -days 2 \
      -extfile "$tmp/$1.ext" -out "$tmp/$1.pem" 2>>"$tmp/openssl.log"
}
if ca ca && ca otherca &&
  leaf server ca 127.0.0.1 "subjectAltName=IP:127.0.0.1,DNS:localhost
extendedKeyUsage=serverAuth" &&
  leaf client ca kex-client "extendedKeyUsage=clientAuth" &&
  leaf stranger otherca kex-stranger "extendedKeyUsage=clientAuth"; then
  ok "openssl makes a CA, a server certificate, a client certificate and one from another CA"
else
  bad "openssl makes the test certificates"
  cat "$tmp/openssl.log"
  finish
fi

# start_tls_kexd ARGS...: kexd on $addr with ARGS (launch_kexd); waits until a TLS client with the CA (and the
# client certificate, which a server without --tls-client-ca ignores) is served, else fails and finishes.
start_tls_kexd() {
  launch_kexd --cache "$tmp/cache.db" --device cpu --grace 1 "$@"
  for _ in $(seq 1 100); do
    [ "$($probe stubs "$addr" --ca "$tmp/ca.pem" --cert "$tmp/client.pem" --key "$tmp/client.key" 2>>"$tmp/probe.err")" = SERVED ] && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  bad "kexd $* starts and serves TLS on $addr"
  cat "$tmp/kexd.log"
  finish
}
# expect WHAT PATTERN OUTPUT: one check that OUTPUT matches the extended regex PATTERN
expect() {
  if [[ "$3" =~ $2 ]]; then ok "$1"; else bad "$1 (got: $3)"; fi
}

# ---- TLS ----
start_tls_kexd --tls-cert "$tmp/server.pem" --tls-key "$tmp/server.key"
expect "TLS: a client with the CA is served health SERVING and OpenJob" '^SERVED$' "$($probe stubs "$addr" --ca "$tmp/ca.pem" 2>>"$tmp/probe.err")"
if grep -q "TLS" "$tmp/kexd.log" && ! grep -q "client certificates required" "$tmp/kexd.log"; then
  ok "TLS: kexd's start line says TLS"
else
  bad "TLS: kexd's start line says TLS"
fi
expect "TLS: the kex package's Client with root_certs is served" '^SERVED$' "$($probe client "$addr" --ca "$tmp/ca.pem" 2>>"$tmp/probe.err")"
expect "TLS: a plaintext client is refused UNAVAILABLE" '^REFUSED UNAVAILABLE' "$($probe stubs "$addr" 2>>"$tmp/probe.err")"
expect "TLS: a client trusting another CA is refused UNAVAILABLE" '^REFUSED UNAVAILABLE' \
  "$($probe stubs "$addr" --ca "$tmp/otherca.pem" 2>>"$tmp/probe.err")"
out=$("$kex" --server "$addr" --tls --root-certs "$tmp/ca.pem" devices 2>&1)
rc=$?
if [ "$rc" = 0 ] && grep -q "cpu" <<<"$out"; then ok "TLS: kex --tls --root-certs CA devices lists cpu"; else bad "TLS: kex --tls --root-certs CA devices (rc $rc: $out)"; fi
out=$("$kex" --server "$addr" devices 2>&1)
rc=$?
if [ "$rc" != 0 ] && grep -q "UNAVAILABLE\|unavailable" <<<"$out"; then ok "TLS: kex without --tls fails, unavailable"; else bad "TLS: kex without --tls fails (rc $rc: $out)"; fi
out=$("$kex" --server "$addr" --tls --root-certs "$tmp/ca.pem" --client-cert "$tmp/client.pem" devices 2>&1)
rc=$?
if [ "$rc" != 0 ] && grep -q "client_key" <<<"$out"; then ok "kex --client-cert without --client-key is refused, naming the key"; else bad "kex --client-cert without --client-key (rc $rc: $out)"; fi
stop_kexd "with TLS"

# ---- mutual TLS (the certificate and key from the environment) ----
KEX_TLS_CERT="$tmp/server.pem" KEX_TLS_KEY="$tmp/server.key" start_tls_kexd --tls-client-ca "$tmp/ca.pem"
if grep -q "client certificates required" "$tmp/kexd.log"; then ok "mTLS: kexd's start line says client certificates are required"; else bad "mTLS: kexd's start line"; cat "$tmp/kexd.log"; fi
expect "mTLS: a client with a certificate signed by the CA is served" '^SERVED$' \
  "$($probe stubs "$addr" --ca "$tmp/ca.pem" --cert "$tmp/client.pem" --key "$tmp/client.key" 2>>"$tmp/probe.err")"
expect "mTLS: the kex package's Client with client_cert/client_key is served" '^SERVED$' \
  "$($probe client "$addr" --ca "$tmp/ca.pem" --cert "$tmp/client.pem" --key "$tmp/client.key" 2>>"$tmp/probe.err")"
expect "mTLS: a TLS client without a certificate is refused UNAVAILABLE" '^REFUSED UNAVAILABLE' \
  "$($probe stubs "$addr" --ca "$tmp/ca.pem" 2>>"$tmp/probe.err")"
expect "mTLS: the kex package's Client without a certificate is refused UNAVAILABLE" '^REFUSED UNAVAILABLE' \
  "$($probe client "$addr" --ca "$tmp/ca.pem" 2>>"$tmp/probe.err")"
expect "mTLS: a client with a certificate from another CA is refused UNAVAILABLE" '^REFUSED UNAVAILABLE' \
  "$($probe stubs "$addr" --ca "$tmp/ca.pem" --cert "$tmp/stranger.pem" --key "$tmp/stranger.key" 2>>"$tmp/probe.err")"
expect "mTLS: a plaintext client is refused UNAVAILABLE" '^REFUSED UNAVAILABLE' "$($probe stubs "$addr" 2>>"$tmp/probe.err")"
out=$("$kex" --server "$addr" --tls --root-certs "$tmp/ca.pem" --client-cert "$tmp/client.pem" --client-key "$tmp/client.key" devices 2>&1)
rc=$?
if [ "$rc" = 0 ] && grep -q "cpu" <<<"$out"; then ok "mTLS: kex --client-cert --client-key devices lists cpu"; else bad "mTLS: kex --client-cert --client-key devices (rc $rc: $out)"; fi
out=$("$kex" --server "$addr" --tls --root-certs "$tmp/ca.pem" devices 2>&1)
rc=$?
if [ "$rc" != 0 ] && grep -qi "unavailable" <<<"$out"; then ok "mTLS: kex without a client certificate fails, unavailable"; else bad "mTLS: kex without a client certificate fails ($out)"; fi
out=$("$kex" --server "$addr" --tls --root-certs "$tmp/ca.pem" --client-cert "$tmp/stranger.pem" --client-key "$tmp/stranger.key" devices 2>&1)
rc=$?
if [ "$rc" != 0 ] && grep -qi "unavailable" <<<"$out"; then ok "mTLS: kex with a certificate from another CA fails, unavailable"; else bad "mTLS: kex with another CA's certificate fails ($out)"; fi
stop_kexd "with mutual TLS"

# ---- bad TLS settings stop kexd at start ----
# start_fails WHAT RC PATTERN ARGS...: kexd ARGS exits RC with a message matching PATTERN
start_fails() {
  local what=$1 want=$2 pattern=$3 rc
  shift 3
  timeout 20 "$kexd" --listen "$addr" --cache "$tmp/cache.db" --device cpu "$@" >"$tmp/bad.log" 2>&1
  rc=$?
  if [ "$rc" = "$want" ] && grep -qE -- "$pattern" "$tmp/bad.log"; then ok "$what"; else bad "$what (rc $rc: $(cat "$tmp/bad.log"))"; fi
}
start_fails "a missing --tls-key file: exit 1 naming it" 1 "--tls-key $tmp/missing.key: cannot open" \
  --tls-cert "$tmp/server.pem" --tls-key "$tmp/missing.key"
KEX_TLS_CERT="$tmp/nope.pem" start_fails "a missing KEX_TLS_CERT file: exit 1 naming it" 1 "--tls-cert $tmp/nope.pem: cannot open" \
  --tls-key "$tmp/server.key"
start_fails "a --tls-cert that is not a PEM certificate: exit 1 naming it" 1 "--tls-cert $tmp/server.key: not PEM" \
  --tls-cert "$tmp/server.key" --tls-key "$tmp/server.key"
start_fails "a missing --tls-client-ca file: exit 1 naming it" 1 "--tls-client-ca $tmp/none.pem: cannot open" \
  --tls-cert "$tmp/server.pem" --tls-key "$tmp/server.key" --tls-client-ca "$tmp/none.pem"
start_fails "a --tls-key that does not match the certificate: exit 1 naming both" 1 "$tmp/server.pem with the key $tmp/stranger.key" \
  --tls-cert "$tmp/server.pem" --tls-key "$tmp/stranger.key"
start_fails "--tls-cert without --tls-key: exit 2 (bad flags)" 2 "--tls-key is missing" --tls-cert "$tmp/server.pem"
start_fails "--tls-client-ca without --tls-cert: exit 2" 2 "--tls-client-ca needs --tls-cert" --tls-client-ca "$tmp/ca.pem"
finish
