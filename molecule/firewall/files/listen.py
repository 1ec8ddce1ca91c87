"""Listen on the given TCP ports (all addresses) and accept until killed: stand-ins for a cluster's
sockets, so that a scan shows who can open a connection to them (Ray is not needed for that).

    python listen.py PORT...
"""

import select
import socket
import sys

socks = []
for port in sys.argv[1:]:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", int(port)))
    s.listen(64)
    socks.append(s)
while True:
    ready, _, _ = select.select(socks, [], [])
    for s in ready:
        conn, _ = s.accept()
        conn.close()
