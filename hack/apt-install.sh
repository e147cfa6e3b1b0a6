#!/bin/sh
# Installs the Debian packages named as arguments that are not installed
# yet. apt-get update runs at most once per boot of the machine (a marker
# in /run), and only when something must be installed. A package's own
# service is never started: the tests run their own servers.
set -eu
missing=""
for p in "$@"; do
	dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
	echo "missing Debian packages:$missing (run as root to install them)" >&2
	exit 1
fi
echo "installing$missing"
export DEBIAN_FRONTEND=noninteractive
policy=/usr/sbin/policy-rc.d
created=""
if [ ! -e "$policy" ]; then
	printf '#!/bin/sh\nexit 101\n' >"$policy"
	chmod +x "$policy"
	created=1
fi
marker=/run/kproxy-apt-updated
if [ ! -e "$marker" ]; then
	apt-get update -qq
	touch "$marker"
fi
status=0
apt-get install -y -qq --no-install-recommends $missing >/dev/null || status=$?
[ -n "$created" ] && rm -f "$policy"
exit $status
