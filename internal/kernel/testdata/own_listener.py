# A filter of its own whose listener answers "continue" to its own clone:
# the fork runs unless something stops the filter or the listener.
import ctypes, threading, struct, platform
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
CLONE = {'x86_64': 56, 'aarch64': 220}[platform.machine()]
SECCOMP = {'x86_64': 317, 'aarch64': 277}[platform.machine()]
def ins(code, jt, jf, k): return struct.pack('HBBI', code, jt, jf, k)
prog = ins(0x20, 0, 0, 0) + ins(0x15, 0, 1, CLONE) + ins(0x06, 0, 0, 0x7fc00000) + ins(0x06, 0, 0, 0x7fff0000)
buf = ctypes.create_string_buffer(prog, len(prog))
class F(ctypes.Structure): _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
fp = F(len(prog) // 8, ctypes.addressof(buf))
box = {}
ready = threading.Event()
def sup():
    ready.wait()
    n = ctypes.create_string_buffer(80)
    if libc.ioctl(box['fd'], ctypes.c_ulong(0xc0502100), n) != 0:
        return
    r = ctypes.create_string_buffer(struct.pack('QqiI', struct.unpack_from('Q', n.raw)[0], 0, 0, 1), 24)
    libc.ioctl(box['fd'], ctypes.c_ulong(0xc0182101), r)
t = threading.Thread(target=sup)
t.start()
libc.prctl(38, 1, 0, 0, 0)
fd = libc.syscall(SECCOMP, 1, 8, ctypes.byref(fp))
if fd < 0:
    ready.set(); box['fd'] = -1
    raise OSError(ctypes.get_errno(), 'own filter')
box['fd'] = fd
ready.set()
pid = libc.syscall(CLONE, 17, 0, 0, 0, 0)
if pid == 0:
    libc._exit(0)
t.join()
print(pid, ctypes.get_errno())
