import { html } from 'htm/preact'
import { useEffect, useState } from 'preact/hooks'
import { api, stream } from './api'
import { age, bytes, time } from './format'
import { Execution } from './results'

export function SandboxPage({ id }: { id: string }) {
  const [sb, setSb] = useState<any>(null)
  const [err, setErr] = useState('')
  useEffect(() => { api('GET', `/v1/sandboxes/${id}`).then(setSb, (x) => setErr(x.message)) }, [id])
  const kill = async () => {
    try { await api('DELETE', `/v1/sandboxes/${id}`); location.hash = '#/' } catch (x: any) { setErr(x.message) }
  }
  if (err) return html`<p class="error">${err}</p>`
  if (!sb) return html`<p class="muted">Loading…</p>`
  return html`<section>
    <div class="bar"><h2>${id}</h2><button class="danger" onClick=${kill}>Kill</button></div>
    <p class="muted">${sb.template} · ${sb.state} · ${age(sb.created_at)} old · ${sb.resources?.cpus ?? '?'} CPUs · ${sb.resources?.memory_mb ?? '?'} MiB</p>
    <div class="columns">
      <div><${Code} id=${id} /><${Command} id=${id} /></div>
      <div><${Previews} id=${id} /><${Files} id=${id} /><${Events} id=${id} /></div>
    </div>
  </section>`
}

function Code({ id }: { id: string }) {
  const [code, setCode] = useState('')
  const [language, setLanguage] = useState('python')
  const [runs, setRuns] = useState<any[]>([])
  const [busy, setBusy] = useState(false)
  const run = async () => {
    setBusy(true)
    try {
      const x = await api('POST', `/v1/sandboxes/${id}/execute`, { code, language })
      setRuns([{ ...x, code }, ...runs])
    } catch (e: any) {
      setRuns([{ code, status: 'refused', error_code: e.code, stderr: e.message }, ...runs])
    } finally { setBusy(false) }
  }
  return html`<div class="panel">
    <h3>Run code</h3>
    <select value=${language} onChange=${(e: any) => setLanguage(e.target.value)}>
      ${['python', 'javascript', 'typescript', 'bash'].map(l => html`<option value=${l}>${l}</option>`)}
    </select>
    <textarea id="code" rows="8" spellcheck=${false} value=${code} onInput=${(e: any) => setCode(e.target.value)}
      onKeyDown=${(e: KeyboardEvent) => { if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) run() }}></textarea>
    <button id="run" disabled=${busy} onClick=${run}>${busy ? 'Running…' : 'Run (Ctrl+Enter)'}</button>
    <div id="executions">${runs.map(x => html`<${Execution} x=${x} />`)}</div>
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

function Events({ id }: { id: string }) {
  const [events, setEvents] = useState<any[]>([])
  useEffect(() => {
    const ctl = new AbortController()
    const seen: any[] = []
    stream(`/v1/sandboxes/${id}/events`, (e) => { seen.unshift(e.data); setEvents(seen.slice(0, 200)) }, ctl.signal).catch(() => {})
    return () => ctl.abort()
  }, [id])
  return html`<div class="panel" id="events"><h3>Events (live)</h3><${EventList} events=${events} /></div>`
}
