#!/bin/sh
# Runs an MCP server over stdio, appending what its client sends to the file $1 and appending this
# process group's id (the SDK starts each server in a session of its own) to $1.pid, so that
# tests can read the client's messages and kill the whole server. Usage: recorded.sh LOG CMD ARGS...
log="$1"
shift
echo $$ >> "$log.pid"
tee -a "$log" | "$@"
