package agent

import (
	"bytes"
	"strconv"
)

// idNames maps numeric user and group ids to names, as read from the
// sandbox's own etc/passwd and etc/group (never the host's).
type idNames struct {
	users, groups map[uint32]string
}

// parseIDFile parses passwd(5) or group(5) text: name:password:id:...
// Malformed lines are skipped; the first name of an id wins.
func parseIDFile(data []byte) map[uint32]string {
	m := make(map[uint32]string)
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		fields := bytes.SplitN(line, []byte(":"), 4)
		if len(fields) < 3 || len(fields[0]) == 0 || fields[0][0] == '#' {
			continue
		}
		id, err := strconv.ParseUint(string(fields[2]), 10, 32)
		if err != nil {
			continue
		}
		if _, dup := m[uint32(id)]; !dup {
			m[uint32(id)] = string(fields[0])
		}
	}
	return m
}

func (n *idNames) user(uid uint32) string  { return lookupID(n.users, uid) }
func (n *idNames) group(gid uint32) string { return lookupID(n.groups, gid) }

func lookupID(m map[uint32]string, id uint32) string {
	if name, ok := m[id]; ok {
		return name
	}
	return strconv.FormatUint(uint64(id), 10)
}
