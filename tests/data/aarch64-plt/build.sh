#!/usr/bin/env bash
# Rebuilds the aarch64 libraries whose PLT entries tracer-user's unit tests find, one per PLT
# layout GNU ld writes: plain, with BTI landing pads, with pointer authentication, with both.
# Needs Debian's gcc-aarch64-linux-gnu.
set -eu
cd "$(dirname "$0")"
cc() {
  aarch64-linux-gnu-gcc -shared -fPIC -O2 -s -Wl,-z,max-page-size=4096 "$@" talk.c
}
cc -o libtalk-plain.so
cc -mbranch-protection=bti -Wl,-z,force-bti -o libtalk-bti.so
cc -mbranch-protection=pac-ret -Wl,-z,pac-plt -o libtalk-pac.so
cc -mbranch-protection=standard -Wl,-z,force-bti,-z,pac-plt -o libtalk-bti-pac.so
