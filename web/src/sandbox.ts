import { html } from 'htm/preact'
import { useEffect, useState } from 'preact/hooks'
import { api, stream } from './api'
import { age, bytes, time } from './format'
import { Execution } from './results'

export function SandboxPage({ id }: { id: string }) {
  const [sb, setSb] = useState<any>(null)
  const [err, setErr] = useState('')
  const [events, setEvents] = useState<any[]>([])
  // ran counts executions the page has seen end (its event stream), so
  // the history reloads when code runs from anywhere.
  const [ran, setRan] = useState(0)
  useEffect(() => { api('GET', `/v1/sandboxes/${id}`).then(setSb, (x) => setErr(x.message)) }, [id])
  useEffect(() => {
    const ctl = new AbortController()
    const seen: any[] = []
    stream(`/v1/sandboxes/${id}/events`, (e) => {
      seen.unshift(e.data)
      setEvents(seen.slice(0, 200))
      if (e.data?.type === 'execution.finished') setRan((n) => n + 1)
    }, ctl.signal).catch(() => {})
    return () => ctl.abort()
  }, [id])
  const kill = async () => {
    try { await api('DELETE', `/v1/sandboxes/${id}`); location.hash = '#/' } catch (x: any) { setErr(x.message) }
  }
  if (err) return html`<p class="error">${err}</p>`
  if (!sb) return html`<p class="muted">Loading…</p>`
  return html`<section>
    <div class="bar"><h2>${id}</h2><button class="danger" onClick=${kill}>Kill</button></div>
    <p class="muted">${sb.template} · ${sb.state} · ${age(sb.created_at)} old · ${sb.resources?.cpus ?? '?'} CPUs · ${sb.resources?.memory_mb ?? '?'} MiB</p>
    <div class="columns">
      <div><${Code} id=${id} ran=${ran} /><${Command} id=${id} /></div>
      <div><${Previews} id=${id} /><${Files} id=${id} /><div class="panel" id="events"><h3>Events (live)</h3><${EventList} events=${events} /></div></div>
    </div>
  </section>`
}

// historyItem is a recorded execution (GET /v1/sandboxes/{id}/executions)
// in the shape Execution renders.
function historyItem(x: any): any {
  const o = x.output ?? {}
  return { ...o, id: x.id, code: x.code, status: x.status, execution_time_ms: x.execution_time_ms,
    error_code: x.error_code, stderr: [o.stderr, x.message].filter(Boolean).join('\n'), language: x.language,
    created_at: x.created_at, cut: x.code_truncated || o.truncated, unkept: x.output === null && x.status !== 'running' && !x.message }
}

const historyPage = 10

// Code runs code and shows the sandbox's executions: its history on the
// server, newest first, whoever ran them (the page, the API, an SDK),
// reloaded when an execution ends, older pages on demand.
function Code({ id, ran }: { id: string; ran: number }) {
  const [code, setCode] = useState('')
  const [language, setLanguage] = useState('python')
  const [history, setHistory] = useState<any[] | null>(null)
  const [older, setOlder] = useState<any[]>([])
  const [next, setNext] = useState('')
  const [refused, setRefused] = useState<any>(null)
  const [busy, setBusy] = useState(false)
  const [err, setErr] = useState('')
  const load = () => api('GET', `/v1/sandboxes/${id}/executions?limit=${historyPage}`).then((p) => {
    setHistory(p.executions.map(historyItem))
    if (older.length === 0) setNext(p.next ?? '')
    setErr('')
  }, (x) => setErr(x.message))
  useEffect(() => { load() }, [id, ran])
  const more = async () => {
    try {
      const p = await api('GET', `/v1/sandboxes/${id}/executions?limit=${historyPage}&cursor=${encodeURIComponent(next)}`)
      setOlder([...older, ...p.executions.map(historyItem)])
      setNext(p.next ?? '')
    } catch (x: any) { setErr(x.message) }
  }
  const run = async () => {
    setBusy(true)
    setRefused(null)
    try {
      await api('POST', `/v1/sandboxes/${id}/execute`, { code, language })
    } catch (e: any) {
      setRefused({ code, status: 'refused', error_code: e.code, stderr: e.message })
    } finally { setBusy(false); load() }
  }
  const seen = new Set((history ?? []).map(x => x.id))
  const all = [...(history ?? []), ...older.filter(x => !seen.has(x.id))]
  return html`<div class="panel">
    <h3>Run code</h3>
    <select value=${language} onChange=${(e: any) => setLanguage(e.target.value)}>
      ${['python', 'javascript', 'typescript', 'bash'].map(l => html`<option value=${l}>${l}</option>`)}
    </select>
    <textarea id="code" rows="8" spellcheck=${false} value=${code} onInput=${(e: any) => setCode(e.target.value)}
      onKeyDown=${(e: KeyboardEvent) => { if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) run() }}></textarea>
    <button id="run" disabled=${busy} onClick=${run}>${busy ? 'Running…' : 'Run (Ctrl+Enter)'}</button>
    ${err && html`<p class="error">${err}</p>`}
    <h3 class="gap">Executions <span class="muted">(newest first, from every client)</span></h3>
    <div id="executions">
      ${refused && html`<${Execution} x=${refused} />`}
      ${history === null ? html`<p class="muted">Loading…</p>` : all.length === 0 && !refused ? html`<p class="muted">No executions yet.</p>` : null}
      ${all.map(x => html`<${Execution} key=${x.id} x=${x} />`)}
    </div>
    ${next && html`<div class="pager"><button id="older" onClick=${more}>Older executions</button></div>`}
  </div>`
}

function Command({ id }: { id: string }) {
  const [cmd, setCmd] = useState('')
  const [out, setOut] = useState<any>(null)
  const run = async (e: Event) => {
    e.preventDefault()
    try { setOut(await api('POST', `/v1/sandboxes/${id}/commands`, { cmd: 'bash', args: ['-c', cmd] })) } catch (x: any) { setOut({ stderr: x.message, exit_code: -1 }) }
  }
  return html`<form class="panel" onSubmit=${run}>
    <h3>Command</h3>
    <input id="command" value=${cmd} onInput=${(e: any) => setCmd(e.target.value)} placeholder="ls -la" />
    ${out && html`<div><span class="muted">exit ${out.exit_code}</span>${out.stdout && html`<pre class="stdout">${out.stdout}</pre>`}${out.stderr && html`<pre class="stderr">${out.stderr}</pre>`}</div>`}
  </form>`
}

function Previews({ id }: { id: string }) {
  const [ports, setPorts] = useState<any[] | null>(null)
  useEffect(() => {
    let stop = false, timer = 0
    const poll = () => api('GET', `/v1/sandboxes/${id}/ports`).then((p) => { if (!stop) { setPorts(p.ports ?? []); timer = setTimeout(poll, 3000) } }, () => setPorts(null))
    poll()
    return () => { stop = true; clearTimeout(timer) }
  }, [id])
  if (!ports || !ports.some(p => p.listening)) return null
  return html`<div class="panel" id="previews"><h3>Previews</h3><ul>
    ${ports.filter(p => p.listening).map(p => html`<li><a target="_blank" rel="noopener noreferrer" href=${p.signed_url || p.url || p.proxy_url}>port ${p.port}</a>${p.public ? ' (public)' : ''}</li>`)}
  </ul></div>`
}

function Files({ id }: { id: string }) {
  const [dir, setDir] = useState('/home/user')
  const [entries, setEntries] = useState<any[]>([])
  const [err, setErr] = useState('')
  const load = () => api('GET', `/v1/sandboxes/${id}/files/list?path=${encodeURIComponent(dir)}`).then((l) => { setEntries(l.entries); setErr('') }, (x) => setErr(x.message))
  useEffect(() => { load() }, [id, dir])
  const download = async (path: string, name: string) => {
    const blob: Blob = await api('GET', `/v1/sandboxes/${id}/files?path=${encodeURIComponent(path)}`)
    const a = document.createElement('a')
    a.href = URL.createObjectURL(blob)
    a.download = name
    a.click()
    setTimeout(() => URL.revokeObjectURL(a.href), 10000)
  }
  const upload = async (e: any) => {
    for (const f of e.target.files as FileList) {
      await api('PUT', `/v1/sandboxes/${id}/files?path=${encodeURIComponent(`${dir}/${f.name}`)}`, f).catch((x) => setErr(x.message))
    }
    e.target.value = ''
    load()
  }
  const up = dir.replace(/\/[^/]+$/, '') || '/'
  return html`<div class="panel" id="files">
    <h3>Files <span class="muted">${dir}</span></h3>
    ${err && html`<p class="error">${err}</p>`}
    <ul>
      ${dir !== '/' && html`<li><button class="linklike" onClick=${() => setDir(up)}>..</button></li>`}
      ${entries.map(f => html`<li>${f.type === 'dir'
        ? html`<button class="linklike" onClick=${() => setDir(f.path)}>${f.name}/</button>`
        : html`<button class="linklike" onClick=${() => download(f.path, f.name)}>${f.name}</button> <span class="muted">${bytes(f.size)}</span>`}</li>`)}
    </ul>
    <label class="upload">Upload <input type="file" multiple onChange=${upload} /></label>
  </div>`
}

export function EventList({ events }: { events: any[] }) {
  return html`<ul class="events">${events.map(e => html`<li key=${e.id} class=${e.type}>
    <span class="muted">${time(e.timestamp)}</span> <strong>${e.type}</strong> ${describe(e)}</li>`)}</ul>`
}

export function describe(e: any): string {
  const d = e.details ?? {}
  switch (e.type) {
    case 'security_violation': return `${d.kind ?? ''} ${d.target ?? ''}`
    case 'resource_exceeded': return `${d.resource ?? ''} (limit ${d.limit ?? '?'})`
    case 'execution.finished': return `${d.status ?? ''} ${d.duration_ms !== undefined ? `${Math.round(d.duration_ms)} ms` : ''}`
    case 'sandbox.stopped': return d.reason ?? ''
    default: return ''
  }
}
