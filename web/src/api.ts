// The dashboard's one way to the server: same-origin requests with the
// session cookie and the X-Sheepfold-UI header (see internal/server/ui.go).

export class ApiError extends Error {
  constructor(public status: number, public code: string, message: string) {
    super(message)
  }
}

const headers = { 'X-Sheepfold-UI': '1' }

async function fail(r: Response): Promise<never> {
  let code = 'ERR_HTTP', message = `${r.status} ${r.statusText}`
  try {
    const body = await r.json()
    code = body.error?.code ?? code
    message = body.error?.message ?? message
  } catch { /* not JSON */ }
  if (r.status === 401) onUnauthorized()
  throw new ApiError(r.status, code, message)
}

let onUnauthorized = () => {}
export function setUnauthorizedHandler(f: () => void) { onUnauthorized = f }

export async function api<T = any>(method: string, path: string, body?: unknown): Promise<T> {
  const init: RequestInit = { method, headers: { ...headers }, credentials: 'same-origin' }
  if (body instanceof Blob || body instanceof FormData) {
    init.body = body
  } else if (body !== undefined) {
    init.body = JSON.stringify(body)
    ;(init.headers as Record<string, string>)['Content-Type'] = 'application/json'
  }
  const r = await fetch(path, init)
  if (!r.ok) return fail(r)
  if (r.status === 204) return undefined as T
  const type = r.headers.get('Content-Type') ?? ''
  return (type.includes('json') ? r.json() : r.blob()) as Promise<T>
}

export async function login(key: string) {
  await api('POST', '/ui/login', { key })
}

export async function logout() {
  await api('POST', '/ui/logout')
}

export interface SSEEvent { id: string; event: string; data: any }

// stream reads a server-sent event stream until it ends or signal aborts.
export async function stream(path: string, onEvent: (e: SSEEvent) => void, signal: AbortSignal) {
  const r = await fetch(path, { headers: { ...headers, Accept: 'text/event-stream' }, credentials: 'same-origin', signal })
  if (!r.ok) return fail(r)
  const reader = r.body!.pipeThrough(new TextDecoderStream()).getReader()
  let buf = ''
  for (;;) {
    const { value, done } = await reader.read()
    if (done) return
    buf += value
    let i
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, i)
      buf = buf.slice(i + 2)
      const ev: SSEEvent = { id: '', event: 'message', data: null }
      const data: string[] = []
      for (const line of block.split('\n')) {
        if (line.startsWith(':')) continue
        const [k, ...rest] = line.split(':')
        const v = rest.join(':').replace(/^ /, '')
        if (k === 'id') ev.id = v
        else if (k === 'event') ev.event = v
        else if (k === 'data') data.push(v)
      }
      if (data.length === 0) continue
      try { ev.data = JSON.parse(data.join('\n')) } catch { ev.data = data.join('\n') }
      onEvent(ev)
    }
  }
}
