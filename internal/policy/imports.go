package policy

import (
	"slices"
	"strings"
)

// moduleTwins are, for a public module of the standard library, the
// modules implemented in C (or the platform's variants) that give what it
// gives under another name: blocking os must block posix, whose functions
// os only re-exports, and allowing os allows posix. The rule about a
// public module covers its twins; a twin named on its own (blocking
// _socket) is a rule about that twin alone.
var moduleTwins = map[string][]string{
	"abc":                   {"_abc", "_py_abc"},
	"ast":                   {"_ast"},
	"asyncio":               {"_asyncio"},
	"bisect":                {"_bisect"},
	"bz2":                   {"_bz2"},
	"codecs":                {"_codecs"},
	"collections":           {"_collections", "_collections_abc"},
	"contextvars":           {"_contextvars"},
	"crypt":                 {"_crypt"},
	"csv":                   {"_csv"},
	"ctypes":                {"_ctypes"},
	"curses":                {"_curses", "_curses_panel"},
	"datetime":              {"_datetime"},
	"dbm":                   {"_dbm", "_gdbm"},
	"decimal":               {"_decimal", "_pydecimal"},
	"functools":             {"_functools"},
	"hashlib":               {"_hashlib", "_md5", "_sha1", "_sha256", "_sha512", "_sha3", "_blake2"},
	"heapq":                 {"_heapq"},
	"importlib":             {"_imp", "_frozen_importlib", "_frozen_importlib_external"},
	"io":                    {"_io", "_pyio"},
	"json":                  {"_json"},
	"locale":                {"_locale"},
	"lzma":                  {"_lzma"},
	"multiprocessing":       {"_multiprocessing", "_posixshmem"},
	"opcode":                {"_opcode"},
	"operator":              {"_operator"},
	"os":                    {"posix", "nt"},
	"os.path":               {"posixpath", "ntpath", "genericpath"},
	"pickle":                {"_pickle", "_compat_pickle"},
	"queue":                 {"_queue"},
	"random":                {"_random"},
	"re":                    {"_sre", "sre_compile", "sre_parse", "sre_constants"},
	"signal":                {"_signal"},
	"socket":                {"_socket"},
	"sqlite3":               {"_sqlite3"},
	"ssl":                   {"_ssl"},
	"stat":                  {"_stat"},
	"statistics":            {"_statistics"},
	"string":                {"_string"},
	"struct":                {"_struct"},
	"subprocess":            {"_posixsubprocess", "_winapi"},
	"symtable":              {"_symtable"},
	"threading":             {"_thread", "_threading_local"},
	"tkinter":               {"_tkinter"},
	"tokenize":              {"_tokenize"},
	"tracemalloc":           {"_tracemalloc"},
	"uuid":                  {"_uuid"},
	"warnings":              {"_warnings"},
	"weakref":               {"_weakref", "_weakrefset"},
	"xml.etree.ElementTree": {"_elementtree"},
	"xml.parsers.expat":     {"pyexpat"},
	"zoneinfo":              {"_zoneinfo"},
}

// WithTwins returns names and the C-level twins of each (moduleTwins):
// those of a listed module and of its submodules (os covers os.path's
// posixpath). The interpreter is given these lists, so that a rule about
// a public module holds for the names that reach it from below.
func WithTwins(names []string) []string {
	if len(names) == 0 {
		return names
	}
	out := slices.Clone(names)
	for _, m := range names {
		for public, twins := range moduleTwins {
			if public == m || strings.HasPrefix(public, m+".") {
				out = append(out, twins...)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
