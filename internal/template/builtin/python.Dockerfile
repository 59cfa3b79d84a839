# The python template: what every sandbox runs on unless it names another.
#
# This file is the template's definition: internal/template (builtin.go)
# reads it, embedded in the binary, and `sheepfold template build python`
# (scripts/setup.sh, `make template`) builds what it says. It is written
# in Dockerfile syntax (parsed by BuildKit's parser) but built with
# debootstrap, not by `template build -f`: FROM names the Debian suite,
# the RUN apt-get install lines the packages installed on top of
# debootstrap's minbase variant (its --include; no recommends), LABEL
# sheepfold.description the description `template list` shows. Nothing
# else is allowed here.
#
# After debootstrap the build (build_linux.go, configure.go) does, in
# this order: the sandbox user `user` (uid 1000, home /home/user), a
# neutral hostname, hosts and resolver files, no apt caches or lists;
# Python's bytecode caches compiled; every setuid and setgid bit removed;
# every owner shifted to the runtime's user namespace mapping.
FROM debian:bookworm

LABEL sheepfold.description="Debian bookworm with Python 3.11 (numpy, pandas, matplotlib), Node.js 18, R 4.2, Java 17 (jshell) and Bash"

# The kernels: Python with the data stack, Node.js (JavaScript and
# TypeScript), Bash. bash and coreutils are Essential (always in minbase)
# but named so that this list says what the kernels rely on. tzdata for
# pandas and zoneinfo; procps for ps, top and kill.
RUN apt-get install -y --no-install-recommends \
      python3 python3-numpy python3-pandas python3-matplotlib \
      nodejs bash coreutils procps tzdata

# For sandboxes whose policy allows a network (internal/egress).
RUN apt-get install -y --no-install-recommends \
      ca-certificates curl git python3-pip python3-requests

# The R and Java kernels: E2B's runCode(language: "r" | "java") names no
# template, so the default one carries every language (their size and
# build time: README.md, "Languages").
RUN apt-get install -y --no-install-recommends \
      r-base-core default-jdk-headless
