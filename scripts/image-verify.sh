#!/usr/bin/env bash
# `make image-verify`: the image signed with a sigstore key and verified by policy, for real, on this machine.
#
#  1. Installs skopeo and docker-registry (Debian) through scripts/install-image-deps.sh, and builds the image
#     ($IMAGE, default localhost/llmslo:dev) with scripts/build-image.sh if local storage lacks it.
#  2. Starts a real OCI registry on loopback: Debian's docker-registry (CNCF distribution 2.8) with a temporary
#     config, a free port and its storage in a temporary directory; stopped on exit (trap).
#  3. Makes a sigstore key pair for this run in cosign's key format, pushes the image to <registry>/llmslo:signed
#     with skopeo and signs it: the signature stored as a sigstore attachment (tag sha256-<hex>.sig beside it,
#     as cosign stores it) through a registries.d entry with `use-sigstore-attachments: true`.
#  4. Pulls through a containers policy.json: `reject` by default, and for this registry `sigstoreSigned` with
#     the public key (keyPath) and signedIdentity matchRepoDigestOrExact. It asserts:
#       - signed accepted: the signed tag, and the same manifest by digest;
#       - unsigned refused: another image (one more label, so another digest) pushed to :unsigned with no
#         signature; and another image signed by another key;
#       - tampered refused: the signed tag overwritten with the image plus one file (a new digest, which nothing
#         signed); then the original signature copied next to that manifest (its payload names the old
#         digest); then that signature's payload rewritten to name the new digest (the signature no longer
#         verifies); then the config changed instead of the content, with the signature copied;
#     each refusal checked to be for the signature, with the tag present in the registry. Last, the original
#     digest is pulled again and accepted: what the refusals caught is the tampering, not a broken key.
#
# Debian bookworm's skopeo 1.9.3 has sigstore compiled out: `--sign-by-sigstore-private-key` and any policy with
# `sigstoreSigned` fail with "Debian-local change: sigstore disabled" (buildah and podman share that
# containers/image), it has no `generate-sigstore-key`, and cosign is not packaged in bookworm. It still reads
# and writes sigstore attachments. So skopeo does every push and pull, signatures included, and
# scripts/sigstore_tool.py does what bookworm lacks, in upstream's formats: the key pair (cosign's encrypted
# PEM), the signature (containers/image's and cosign's simple-signing payload, added to a `dir:` copy that
# skopeo pushes back with --preserve-digests), and the policy.json decision on each pulled `dir:` copy
# (containers/image's sigstoreSigned rules, with `cryptography` and PyNaCl in a small venv of its own,
# .cache/sigstore-keys-venv). Where skopeo does have sigstore, it enforces the same policy.json on every pull
# as well, and the two decisions must agree.
# Exit 1 if any outcome is wrong. Needs root (like `make image`: containers-storage as buildah wrote it).
# Environment: IMAGE, PY (the Python that makes the key venv; default python3), STORAGE_DRIVER (default vfs).
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-localhost/llmslo:dev}
PY=${PY:-python3}
export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs}  # what scripts/build-image.sh builds with
KEYS_VENV=.cache/sigstore-keys-venv

say() { echo "image-verify: $*" >&2; }
die() { echo "image-verify: FAILED: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "run as root (the image is in root's containers-storage), e.g. sudo make image-verify"

./scripts/install-image-deps.sh
if ! buildah inspect --type image "$IMAGE" >/dev/null 2>&1; then
  say "$IMAGE is not in local storage: building it (scripts/build-image.sh)"
  IMAGE=$IMAGE ./scripts/build-image.sh
fi
if [ ! -f "$KEYS_VENV/.installed" ]; then
  say "installing cryptography and PyNaCl into $KEYS_VENV (for scripts/sigstore_tool.py)"
  rm -rf "$KEYS_VENV"
  "$PY" -m venv "$KEYS_VENV"
  "$KEYS_VENV/bin/pip" install -q cryptography pynacl
  touch "$KEYS_VENV/.installed"
fi
tool() { "$KEYS_VENV/bin/python" scripts/registry_tool.py "$@"; }

work=$(mktemp -d /var/tmp/llmslo-image-verify.XXXXXX)
registry_pid=""
cleanup() {
  if [ -n "$registry_pid" ]; then kill "$registry_pid" 2>/dev/null || true; wait "$registry_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM  # through the EXIT trap: the registry is stopped and its storage removed

# The registry: a free port (taken again by the time it binds? then another one, three tries).
for _ in 1 2 3; do
  port=$(tool free-port)
  reg=127.0.0.1:$port
  cat >"$work/registry.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $work/storage
  delete:
    enabled: true
http:
  addr: $reg
EOF
  docker-registry serve "$work/registry.yml" >"$work/registry.log" 2>&1 &
  registry_pid=$!
  if tool wait "$reg" 2>/dev/null && kill -0 "$registry_pid" 2>/dev/null; then break; fi
  kill "$registry_pid" 2>/dev/null || true; wait "$registry_pid" 2>/dev/null || true; registry_pid=""
done
[ -n "$registry_pid" ] || { tail -20 "$work/registry.log" >&2; die "docker-registry did not start"; }
say "registry $(docker-registry --version | awk '{print $NF}') at http://$reg (pid $registry_pid, storage in $work)"
repo=llmslo

# Keys: the one the policy trusts, and another one (someone else's).
sigstore() { "$KEYS_VENV/bin/python" scripts/sigstore_tool.py "$@"; }
sigstore keygen "$work/key"
sigstore keygen "$work/other-key"

mkdir -p "$work/registries.d"
cat >"$work/registries.d/llmslo-image-verify.yaml" <<EOF
docker:
  $reg:
    use-sigstore-attachments: true
EOF
# Pushing and signing read a local image: the verification policy (which rejects everything else) is not for them.
cat >"$work/push-policy.json" <<EOF
{"default": [{"type": "insecureAcceptAnything"}]}
EOF
cat >"$work/policy.json" <<EOF
{
  "default": [{"type": "reject"}],
  "transports": {
    "docker": {
      "$reg": [{
        "type": "sigstoreSigned",
        "keyPath": "$work/key/cosign.pub",
        "signedIdentity": {"type": "matchRepoDigestOrExact"}
      }]
    }
  }
}
EOF
skopeo_() {  # skopeo_ POLICY ARGS...: skopeo with a policy and this run's registries.d
  local policy=$1; shift
  skopeo --policy "$policy" --registries.d "$work/registries.d" "$@"
}
sign() {  # sign TAG KEYDIR: sign what the registry has at TAG (by its digest), as `cosign sign` would
  rm -rf "$work/sign"
  skopeo_ "$work/push-policy.json" copy --quiet --src-tls-verify=false --preserve-digests \
    "docker://$reg/$repo:$1" "dir:$work/sign"
  sigstore sign --key "$2" --reference "$reg/$repo:$1" "$work/sign"
  skopeo_ "$work/push-policy.json" copy --quiet --dest-tls-verify=false --preserve-digests \
    "dir:$work/sign" "docker://$reg/$repo:$1"
  rm -rf "$work/sign"
}

say "pushing $IMAGE to $reg/$repo:signed (skopeo $(skopeo --version | awk '{print $NF}')) and signing it"
skopeo_ "$work/push-policy.json" copy --quiet --dest-tls-verify=false \
  "containers-storage:$IMAGE" "docker://$reg/$repo:signed"
sign signed "$work/key"
signed=$(tool digest "$reg" "$repo" signed)
sig_tag=$(tool sig-tag "$signed")
tool digest "$reg" "$repo" "$sig_tag" >/dev/null || die "no sigstore attachment $sig_tag after signing"
say "signed $repo@$signed; its signature is $repo:$sig_tag"

# Can this skopeo enforce sigstoreSigned itself? Debian bookworm's cannot (sigstore compiled out).
native=1
if ! skopeo_ "$work/policy.json" copy --quiet --src-tls-verify=false "docker://$reg/$repo:signed" \
     "dir:$work/probe" >"$work/probe.log" 2>&1 && grep -q "sigstore disabled" "$work/probe.log"; then
  native=0
  say "this skopeo has sigstore compiled out (\"$(grep -oE '([A-Za-z-]+ )*[A-Za-z-]+: sigstore disabled' \
    "$work/probe.log" | head -1)\"): policy.json is decided by scripts/sigstore_tool.py"
else
  say "this skopeo enforces sigstoreSigned itself: each decision below is made by it and by scripts/sigstore_tool.py"
fi
rm -rf "$work/probe"

failures=0
decide() {  # decide REF NAME: pull (image and signatures), decide by policy.json; 0 accepted, 1 refused; log: pull-NAME.log
  local ours native_rc
  rm -rf "$work/pulled"
  : >"$work/pull-$2.log"
  if ! skopeo_ "$work/push-policy.json" copy --quiet --src-tls-verify=false "docker://$reg/$repo$1" \
       "dir:$work/pulled" >>"$work/pull-$2.log" 2>&1; then
    echo "the pull failed: no policy decision" >>"$work/pull-$2.log"; return 2
  fi
  ours=0
  sigstore verify --policy "$work/policy.json" --reference "$reg/$repo$1" "$work/pulled" >>"$work/pull-$2.log" 2>&1 \
    || ours=1
  if [ "$native" = 1 ]; then
    native_rc=0
    skopeo_ "$work/policy.json" copy --quiet --src-tls-verify=false "docker://$reg/$repo$1" "dir:$work/pulled-native" \
      >>"$work/pull-$2.log" 2>&1 || native_rc=1
    rm -rf "$work/pulled-native"
    if [ "$native_rc" != "$ours" ]; then
      echo "skopeo's own policy check disagrees (skopeo: $native_rc, sigstore_tool: $ours)" >>"$work/pull-$2.log"
      return 3
    fi
  fi
  return "$ours"
}
accepted() {  # accepted NAME REF DIGEST
  local rc=0
  decide "$2" "$1" || rc=$?
  if [ "$rc" = 0 ] && [ "$(sha256sum <"$work/pulled/manifest.json" | cut -d' ' -f1)" = "${3#sha256:}" ]; then
    say "  ok: $1 ($repo$2): $(grep -E '^accepted' "$work/pull-$1.log")"
  else
    say "  WRONG: $1 ($repo$2) was not accepted:"; sed 's/^/    /' "$work/pull-$1.log" >&2
    failures=$((failures + 1))
  fi
  rm -rf "$work/pulled"
}
refused() {  # refused NAME REF REASON-REGEX: refused by the policy, for the signature, while the manifest is there
  local present rc=0
  present=$(tool digest "$reg" "$repo" "${2#[:@]}" 2>/dev/null) || present=""
  if [ -z "$present" ]; then
    say "  WRONG: $1: $repo$2 is not in the registry, so a refusal would prove nothing"
    failures=$((failures + 1)); return
  fi
  decide "$2" "$1" || rc=$?
  if [ "$rc" = 0 ]; then
    say "  WRONG: $1 ($repo$2 = $present) was accepted"; failures=$((failures + 1))
  elif [ "$rc" = 1 ] && grep -Eq "^refused: .*($3)" "$work/pull-$1.log"; then
    say "  ok: $1 ($repo$2 = ${present:0:19}...): $(grep -E '^refused' "$work/pull-$1.log")"
  else
    say "  WRONG: $1 ($repo$2) was not refused for its signature (expected /$3/):"
    sed 's/^/    /' "$work/pull-$1.log" >&2; failures=$((failures + 1))
  fi
  rm -rf "$work/pulled"
}

say "signed:"
accepted "signed tag" ":signed" "$signed"
accepted "signed, by digest" "@$signed" "$signed"

say "unsigned:"
unsigned=$(tool derive "$reg" "$repo" signed unsigned --label "org.opencontainers.image.description=llmslo, unsigned")
refused "unsigned" ":unsigned" "A signature was required, but no signature exists"
other=$(tool derive "$reg" "$repo" signed other-key --label "org.opencontainers.image.description=llmslo, another key")
sign other-key "$work/other-key"
tool digest "$reg" "$repo" "$(tool sig-tag "$other")" >/dev/null || die "the other key's signature was not written"
refused "signed by another key" ":other-key" "cryptographic signature verification failed"
[ "$unsigned" != "$signed" ] && [ "$other" != "$signed" ] || die "the derived images did not get new digests"

say "tampered (the signed tag moved to other bytes):"
tampered=$(tool derive "$reg" "$repo" "$signed" signed \
  --add-file "/opt/llmslo/TAMPERED=this file was added after the image was signed")
refused "tampered content" ":signed" "A signature was required, but no signature exists"
tool copy-manifest "$reg" "$repo" "$sig_tag" "$(tool sig-tag "$tampered")" >/dev/null
refused "tampered content, signature copied" ":signed" "does not match"
tool forge-signature "$reg" "$repo" "$sig_tag" "$tampered" >/dev/null
refused "tampered content, payload rewritten" ":signed" "cryptographic signature verification failed"
reconfigured=$(tool derive "$reg" "$repo" "$signed" signed --label "org.opencontainers.image.source=https://evil.example")
tool copy-manifest "$reg" "$repo" "$sig_tag" "$(tool sig-tag "$reconfigured")" >/dev/null
refused "tampered config, signature copied" ":signed" "does not match"
accepted "the original, by digest, still" "@$signed" "$signed"

if [ "$failures" -ne 0 ]; then
  say "registry log (tail):"; tail -20 "$work/registry.log" >&2
  die "$failures outcome(s) wrong"
fi
echo "image-verify: signed accepted, unsigned refused, tampered refused"
