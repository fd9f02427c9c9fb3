#!/usr/bin/env bash
# test_auth.sh - kexd --auth (tenants and tokens), secure by default and the
# operations surface: tokens made by `kex auth token`; a malformed --auth
# file stops kexd naming the entry; a non-loopback --listen without --auth
# and TLS is refused unless --insecure; kexd/kex --version; the text access
# log; then test_auth.py against one kexd with --auth, TLS (certificates made
# here with openssl), --log-format json and --metrics: no token, wrong token,
# user vs admin, another tenant's job, each tenant limit while another
# tenant keeps working, the server limits, SIGHUP reload (good and bad
# file), kex health, and the JSON access-log lines.
#
# Env: KEX_BUILD_DIR (default build).  Last line "N passed, N failed".
. "$(dirname "$0")/lib.bash"
kex=$build/kex
[ -x "$kex" ] || { bad "kex is built ($kex)"; finish; }
command -v openssl >/dev/null || { bad "openssl is installed"; finish; }

# expect WHAT PATTERN OUTPUT: one check that OUTPUT matches the extended regex PATTERN
expect() {
  if [[ "$3" =~ $2 ]]; then ok "$1"; else bad "$1 (got: ${3:0:600})"; fi
}

# ---- versions ----
version=$(sed -n "s/^ *version : '\([^']*\)'.*/\1/p" meson.build | head -n 1)
expect "kexd --version prints meson's project version" "^kexd $version\$" "$("$kexd" --version 2>&1)"
expect "kex --version prints meson's project version" "^kex $version\$" "$("$kex" --version 2>&1)"

# ---- tokens ----
for t in ops:admin alice:user bob:user carol:user dave:user; do
  name=${t%%:*}
  "$kex" auth token --name "$name" --role "${t#*:}" >"$tmp/$name.tok" 2>&1
done
expect "kex auth token prints a 64-hex token, then the --auth entry with its SHA-256" \
  '^[0-9a-f]{64}
\{"name": "alice", "role": "user", "token_sha256": "[0-9a-f]{64}"\}$' "$(cat "$tmp/alice.tok")"
tok() { head -n 1 "$tmp/$1.tok"; }
entry() { tail -n 1 "$tmp/$1.tok"; }
sha=$(printf %s "$(tok alice)" | openssl dgst -sha256 -r | cut -d' ' -f1)
expect "the entry's token_sha256 is the SHA-256 of the token (openssl agrees)" "\"token_sha256\": \"$sha\"" "$(entry alice)"
[ "$(tok alice)" != "$(tok bob)" ] && ok "two tokens differ" || bad "two tokens differ"
# alice: every limit; carol may not Tune; bob and ops unlimited
alice=$(entry alice | sed 's/}$/, "max_jobs": 2, "max_bytes": 4096, "max_weight": 4, "max_beam": 2}/')
carol=$(entry carol | sed 's/}$/, "may_tune": false}/')
printf '{"tenants": [%s, %s, %s, %s]}\n' "$(entry ops)" "$alice" "$(entry bob)" "$carol" >"$tmp/auth.json"

# ---- a malformed file stops kexd naming the entry ----
printf '{"tenants": [%s, {"name": "bob", "role": "user", "token_sha256": "12ab"}]}\n' "$(entry ops)" >"$tmp/bad.json"
out=$("$kexd" --listen "127.0.0.1:$port" --device cpu --cache "" --auth "$tmp/bad.json" 2>&1)
rc=$?
expect "a malformed --auth file: kexd exits 1 naming the entry and the field (rc $rc)" \
  'tenants\[1\] \("bob"\): "token_sha256" must be' "$rc $out"
[ "$rc" = 1 ] || bad "a malformed --auth file: exit 1 (got $rc)"
printf '{"tenants": [%s, %s]}\n' "$(entry ops)" "$(entry ops | sed 's/"ops"/"ops2"/')" >"$tmp/dup.json"
expect "an --auth file with one token twice: refused naming both entries" \
  'tenants\[1\] \("ops2"\): the token_sha256 of tenants\[0\] \("ops"\)' \
  "$("$kexd" --listen "127.0.0.1:$port" --device cpu --cache "" --auth "$tmp/dup.json" 2>&1)"
printf '{"tenants": [{"name": "x", "role": "root", "token_sha256": "%s"}]}\n' "$sha" >"$tmp/role.json"
expect "an unknown role: refused naming the entry" 'tenants\[0\] \("x"\): "role" must be' \
  "$("$kexd" --listen "127.0.0.1:$port" --device cpu --cache "" --auth "$tmp/role.json" 2>&1)"

printf '{"tenants": [%s]}\n' "$(entry alice | sed 's/}$/, "max_job": 1}/')" >"$tmp/typo.json"
expect "a misspelt limit (max_job): refused as an unknown key, never silently unlimited" \
  'tenants\[0\] \("alice"\): unknown key "max_job"' \
  "$("$kexd" --listen "127.0.0.1:$port" --device cpu --cache "" --auth "$tmp/typo.json" 2>&1)"

# ---- secure by default ----
out=$("$kexd" --listen "0.0.0.0:$port" --device cpu --cache "" 2>&1)
rc=$?
expect "--listen 0.0.0.0 without --auth and TLS: refused (exit 2) saying why and naming --insecure" \
  '^2 .*refusing to listen on 0\.0\.0\.0:[0-9]+: it is not a loopback address.*--auth and TLS.*--insecure' "$rc $out"
expect "--listen 0.0.0.0 with --auth but no TLS: still refused, naming TLS" \
  'refusing to listen.*without TLS' \
  "$("$kexd" --listen "0.0.0.0:$port" --device cpu --cache "" --auth "$tmp/auth.json" 2>&1)"
expect "KEX_LISTEN=[::]:PORT without --auth: refused" 'refusing to listen on \[::\]' \
  "$(KEX_LISTEN="[::]:$port" "$kexd" --device cpu --cache "" 2>&1)"
expect "--beam wider than --max-beam: refused at start (every Submit would be)" \
  '--beam 20 is more than --max-beam 16' "$("$kexd" --beam 20 --device cpu --cache "" 2>&1)"
"$kexd" --listen "0.0.0.0:$port" --insecure --device cpu --cache "" --grace 1 >"$tmp/kexd.log" 2>&1 &
pid=$!
need_healthy
expect "--insecure: kexd starts on 0.0.0.0 and kex health says SERVING" '^SERVING$' \
  "$("$kex" --server "127.0.0.1:$port" health 2>&1)"
"$kex" --server "127.0.0.1:$port" stats --json >/dev/null 2>&1
sleep 0.2
expect "text access log: one line per RPC with method, tenant, peer, status and milliseconds" \
  'info  access method=GetStats tenant=- peer=ipv4:127\.0\.0\.1 status=OK ms=[0-9.]+' "$(cat "$tmp/kexd.log")"
expect "the health check is access-logged too" 'access method=Check tenant=- peer=ipv4:127\.0\.0\.1 status=OK' \
  "$(cat "$tmp/kexd.log")"
stop_kexd "--insecure on 0.0.0.0"

# ---- certificates for the TLS + auth kexd ----
if openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj "/CN=kex auth test CA" \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
  -keyout "$tmp/ca.key" -out "$tmp/ca.pem" 2>>"$tmp/openssl.log" &&
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=127.0.0.1" \
    -keyout "$tmp/server.key" -out "$tmp/server.csr" 2>>"$tmp/openssl.log" &&
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$tmp/server.ext" &&
  openssl x509 -req -in "$tmp/server.csr" -CA "$tmp/ca.pem" -CAkey "$tmp/ca.key" -CAcreateserial -days 2 \
    -extfile "$tmp/server.ext" -out "$tmp/server.pem" 2>>"$tmp/openssl.log"; then
  ok "openssl makes a CA and a server certificate"
else
  bad "openssl makes the test certificates"
  cat "$tmp/openssl.log"
  finish
fi

run_py test_auth.py KEXD="$kexd" KEX="$kex" KEXD_TMP="$tmp" KEXD_AUTH="$tmp/auth.json" \
  TOK_OPS="$(tok ops)" TOK_ALICE="$(tok alice)" TOK_BOB="$(tok bob)" TOK_CAROL="$(tok carol)" TOK_DAVE="$(tok dave)" \
  ENTRY_OPS="$(entry ops)" ENTRY_ALICE="$alice" ENTRY_CAROL="$carol" ENTRY_DAVE="$(entry dave)"
finish
