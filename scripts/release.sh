#!/usr/bin/env bash
# `make release`: dist/ for the version pyproject.toml names, for a maintainer to publish.
#
#   dist/llmslo-<version>-py3-none-any.whl, dist/llmslo-<version>.tar.gz
#                                     the wheel and the sdist (`python -m build`, from the project's .venv)
#   dist/llmslo-<version>.oci.tar     the image ($IMAGE, default localhost/llmslo:dev, which `make release`
#                                     rebuilds first) as an OCI archive, layers gzip-compressed as a registry
#                                     stores them
#   dist/llmslo-<version>.digest      its manifest digest (sha256:...), what a registry shows once the archive is
#                                     pushed unchanged:  skopeo copy --preserve-digests \
#                                       oci-archive:dist/llmslo-<version>.oci.tar docker://<registry>/llmslo:<version>
#                                     and what the overlays pin and the signature covers (docs/deploy.md)
#   dist/llmslo-<version>.changelog.md  the version's CHANGELOG.md entry (the release notes)
#   dist/SHA256SUMS                   the files above
#
# The version is read once, from the installed distribution's metadata (llmslo/version.py, which every
# `--version`, `llmslo_build_info` and the rules' `sloth_version` also read) and checked against pyproject.toml,
# the wheel's and sdist's names and the image's own `llmslo-exporter --version`. Refuses when CHANGELOG.md has no
# `## [<version>]` entry, and when the git work tree has uncommitted changes (ALLOW_DIRTY=1 to build anyway,
# e.g. to try this script). Needs root, like `make image` (the image is in root's containers-storage).
# Environment: IMAGE, VENV (default .venv), DIST (default dist), ALLOW_DIRTY.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-localhost/llmslo:dev}
VENV=${VENV:-.venv}
DIST=${DIST:-dist}
export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs} BUILDAH_ISOLATION=${BUILDAH_ISOLATION:-chroot}  # as build-image.sh

say() { echo "release: $*" >&2; }
die() { echo "release: refused: $*" >&2; exit 1; }
[ -x "$VENV/bin/python" ] || die "no $VENV: run make deps (make release does)"
[ "$(id -u)" -eq 0 ] || die "run as root (the image is in root's containers-storage), e.g. sudo make release"

version=$("$VENV/bin/python" -c 'from llmslo.version import version; print(version())')
declared=$("$VENV/bin/python" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
[ "$version" = "$declared" ] || die "the installed llmslo is $version but pyproject.toml says $declared: run make deps"
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+([.-]?(a|b|rc)[0-9]+)?$ ]] || die "version $version is not a release version"

# The release notes: CHANGELOG.md's "## [<version>] - YYYY-MM-DD" section, up to the next "## [".
notes=$(awk -v v="$version" '
  index($0, "## [" v "]") == 1 { on = 1; print; next }
  on && /^## \[/ { exit }
  on { print }' CHANGELOG.md 2>/dev/null || true)
[ -n "$notes" ] || die "CHANGELOG.md has no entry for $version: add a '## [$version] - YYYY-MM-DD' section first"
grep -Eq "^## \[$version\] - [0-9]{4}-[0-9]{2}-[0-9]{2}$" <<<"$notes" \
  || die "CHANGELOG.md's entry for $version has no date: write it as '## [$version] - YYYY-MM-DD'"
[ "$(grep -cvE '^(## \[|[[:space:]]*$)' <<<"$notes")" -gt 0 ] || die "CHANGELOG.md's entry for $version is empty"

if [ -z "${ALLOW_DIRTY:-}" ] && git rev-parse --git-dir >/dev/null 2>&1 && [ -n "$(git status --porcelain)" ]; then
  die "the work tree has uncommitted changes: commit them (or ALLOW_DIRTY=1 to build from them anyway)"
fi

command -v skopeo >/dev/null && command -v buildah >/dev/null || die "skopeo or buildah missing: run make image"
buildah inspect --type image "$IMAGE" >/dev/null 2>&1 || die "$IMAGE is not built: run make image (make release does)"
"$VENV/bin/python" -m build --version >/dev/null 2>&1 || die "'build' is missing from $VENV: run make deps"

say "llmslo $version into $DIST/"
rm -rf "$DIST"
mkdir -p "$DIST"
echo '*' >"$DIST/.gitignore"  # build output: never committed (the archive alone is about 100 MB)

# The Python distributions, built in an isolated environment from the build-system requirements.
"$VENV/bin/python" -m build --sdist --wheel --outdir "$DIST" . >"$DIST/.build.log" 2>&1 \
  || { tail -30 "$DIST/.build.log" >&2; die "python -m build failed (log above)"; }
rm -f "$DIST/.build.log"
for f in "llmslo-$version-py3-none-any.whl" "llmslo-$version.tar.gz"; do
  [ -f "$DIST/$f" ] || die "python -m build did not write $DIST/$f (it wrote: $(ls "$DIST"))"
done

# The image's own idea of its version (the entrypoint, as its user). Debian's buildah 1.28 now and then returns
# from `buildah run` with status 0 and none of the command's output: up to three tries.
ctr=$(buildah from --pull-never --quiet "$IMAGE")
in_image=""
for _ in 1 2 3; do
  in_image=$(buildah run --user 65532:65532 "$ctr" -- llmslo-exporter --version 2>&1) || in_image="(failed: $in_image)"
  [ -n "$in_image" ] && break
done
buildah rm "$ctr" >/dev/null
[[ "$in_image" == "llmslo-exporter $version "* ]] \
  || die "$IMAGE says '$in_image', not llmslo-exporter $version: rebuild it (make image)"

# The image as an OCI archive, its layers gzip'd as a registry stores them, so a push with --preserve-digests
# keeps the manifest, and so the digest, that this file records.
archive="$DIST/llmslo-$version.oci.tar"
skopeo --insecure-policy copy --quiet --dest-compress --dest-compress-format gzip \
  "containers-storage:$IMAGE" "oci-archive:$archive:$version"
digest=$(skopeo inspect --format '{{.Digest}}' "oci-archive:$archive")
# The same digest by hand: the sha256 of the manifest blob the archive's index.json names.
by_hand=$("$VENV/bin/python" - "$archive" <<'EOF'
import hashlib, json, sys, tarfile
with tarfile.open(sys.argv[1]) as tar:
    (entry,) = json.load(tar.extractfile("index.json"))["manifests"]
    algorithm, _, hexdigest = entry["digest"].partition(":")
    blob = tar.extractfile(f"blobs/{algorithm}/{hexdigest}").read()
    manifest = json.loads(blob)
    assert all(layer["mediaType"].endswith("+gzip") for layer in manifest["layers"]), "uncompressed layers"
    print(f"sha256:{hashlib.sha256(blob).hexdigest()}")
EOF
)
[[ "$digest" =~ ^sha256:[0-9a-f]{64}$ ]] && [ "$digest" = "$by_hand" ] \
  || die "the archive's digest is unclear (skopeo: $digest, its manifest blob: $by_hand)"
echo "$digest" >"$DIST/llmslo-$version.digest"

printf '%s\n' "$notes" >"$DIST/llmslo-$version.changelog.md"
(cd "$DIST" && sha256sum -- * >SHA256SUMS)

say "wrote:"
(cd "$DIST" && ls -l --time-style=+ | tail -n +2) >&2
say "image digest $digest; publish with:"
say "  skopeo copy --preserve-digests oci-archive:$archive docker://<registry>/llmslo:$version"
say "  then sign $digest (docs/deploy.md, \"Signed images\") and pin it in your overlay"
