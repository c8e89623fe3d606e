/**
 * The sidebar's "My week" section: my GPU-hours this week (charged and busy, per project),
 * this session's live GPU utilisation, and asking the project's managers for more GPU-hours.
 *
 * It asks the service itself (through the server extension), on each refresh of the panel's
 * model: `me/week`, `sessions/<id>/utilisation`, `budget-requests`; and only when the
 * service has those endpoints (`info.features.my_week`, `info.features.budget_requests`).
 */
import React from 'react';

import { ApiError, GpuBudgetClient } from './api';
import { BudgetModel } from './model';

export interface IWeekFigures {
  charged_gpu_h: number;
  busy_gpu_h: number | null;
  measured_gpu_h: number;
  idle_gpu_h: number | null;
  idle_share: number | null;
}

export interface IMyWeek {
  user: string;
  tz: string;
  from: number;
  to: number;
  from_local: string;
  projects: Array<IWeekFigures & { project: string }>;
  totals: IWeekFigures;
}

export interface IUtilisation {
  session: string;
  status: 'live' | 'stale' | 'unknown';
  utilisation: number | null;
  average: number | null;
  at: number | null;
  age_s: number | null;
  source: string | null;
  message: string;
  /** memory its GPUs use per slice (null: unknown, nothing reads it) */
  memory?: IGpuMemory[] | null;
}

export interface IGpuMemory {
  gpu: string;
  used_bytes: number;
  total_bytes: number;
  /** an MPS share: the figures are its whole GPU's */
  shared: boolean;
}

export interface IBudgetRequest {
  id: number;
  project: string;
  user: string;
  gpu_hours: number;
  reason: string;
  state: 'pending' | 'granted' | 'declined';
  created_at: number;
  decided_by: string | null;
  note: string;
  notified?: string[];
}

/** GPU-hours as the sidebar's week says them: one decimal below 100, none above. */
export function hoursText(h: number): string {
  return Math.abs(h) < 100 ? h.toFixed(1) : h.toFixed(0);
}

/** "12.3 GPU-h charged, 4.1 busy" — busy "unknown" where nothing measured (never 0). */
export function weekWords(f: IWeekFigures): string {
  const busy = f.busy_gpu_h === null ? 'busy unknown' : `${hoursText(f.busy_gpu_h)} busy`;
  return `${hoursText(f.charged_gpu_h)} GPU-h charged, ${busy}`;
}

/** The live utilisation in words: "37 % busy (live)", "unknown (…)". */
export function utilisationWords(u: IUtilisation | null): string {
  if (u === null) {
    return '–';
  }
  if (u.status === 'unknown' || u.utilisation === null) {
    return 'unknown (nothing measures this GPU: no NVIDIA driver, or a declared inventory)';
  }
  const pct = `${Math.round(100 * u.utilisation)} % busy`;
  if (u.status === 'stale') {
    return `${pct} (last sample ${Math.round(u.age_s ?? 0)} s ago)`;
  }
  return u.average !== null
    ? `${pct} now; ${Math.round(100 * u.average)} % since it started`
    : `${pct} now`;
}

function gib(bytes: number): string {
  const g = Math.round((10 * bytes) / 2 ** 30) / 10;
  return Number.isInteger(g) ? g.toFixed(0) : g.toFixed(1);
}

/** The memory of this session's GPUs in words, one line per GPU: "12.1 of 80 GiB";
 * "unknown (…)" where nothing reads it (never 0). */
export function memoryWords(u: IUtilisation | null): string[] {
  if (u === null) {
    return ['–'];
  }
  const mem = u.memory ?? null;
  if (mem === null || mem.length === 0) {
    return ['unknown (nothing reads this GPU: no NVIDIA driver, or a declared inventory)'];
  }
  return mem.map(
    m =>
      `${gib(m.used_bytes)} of ${gib(m.total_bytes)} GiB` +
      (mem.length > 1 ? ` (GPU ${m.gpu})` : '') +
      (m.shared ? ', the whole shared GPU' : '')
  );
}

/** Check the request form: the body to send, or the field's problem. */
export function requestBody(
  project: string,
  hours: string,
  reason: string
): { body: { project: string; gpu_hours: number; reason: string } } | { error: string } {
  const h = Number(hours);
  if (!project) {
    return { error: 'Choose a project.' };
  }
  if (!hours.trim() || !Number.isFinite(h) || h <= 0) {
    return { error: 'GPU-hours: a number above 0.' };
  }
  if (!reason.trim()) {
    return { error: 'Say what the GPU-hours are for.' };
  }
  return { body: { project, gpu_hours: h, reason: reason.trim() } };
}

export class MyWeekClient {
  constructor(private readonly api: GpuBudgetClient) {}

  week(tz: string): Promise<IMyWeek> {
    return this.api.request<IMyWeek>(`v1/me/week?tz=${encodeURIComponent(tz)}`);
  }

  utilisation(session: string): Promise<IUtilisation> {
    return this.api.request<IUtilisation>(
      `v1/sessions/${encodeURIComponent(session)}/utilisation`
    );
  }

  requests(): Promise<{ requests: IBudgetRequest[] }> {
    return this.api.request<{ requests: IBudgetRequest[] }>(
      'v1/budget-requests?state=pending,granted,declined'
    );
  }

  ask(body: { project: string; gpu_hours: number; reason: string }): Promise<IBudgetRequest> {
    return this.api.request<IBudgetRequest>('v1/budget-requests', {
      method: 'POST',
      body: JSON.stringify(body),
      headers: { 'Content-Type': 'application/json' }
    });
  }
}

interface IState {
  week: IMyWeek | null;
  util: IUtilisation | null;
  mine: IBudgetRequest[];
  error: string | null;
}

function RequestForm(props: {
  projects: string[];
  client: MyWeekClient;
  onDone: (r: IBudgetRequest) => void;
}) {
  const [open, setOpen] = React.useState(false);
  const [picked, setProject] = React.useState('');
  // the projects arrive with the week (after the form was made): the first until one is picked
  const project = props.projects.includes(picked) ? picked : (props.projects[0] ?? '');
  const [hours, setHours] = React.useState('');
  const [reason, setReason] = React.useState('');
  const [error, setError] = React.useState<string | null>(null);
  const [busy, setBusy] = React.useState(false);
  if (!open) {
    return (
      <button
        className="jp-GpuBudget-button jp-GpuBudget-askMore"
        onClick={() => setOpen(true)}
        disabled={props.projects.length === 0}
      >
        Ask for more GPU-hours…
      </button>
    );
  }
  const submit = async (ev: React.FormEvent) => {
    ev.preventDefault();
    const checked = requestBody(project, hours, reason);
    if ('error' in checked) {
      setError(checked.error);
      return;
    }
    setBusy(true);
    setError(null);
    try {
      const r = await props.client.ask(checked.body);
      setOpen(false);
      setHours('');
      setReason('');
      props.onDone(r);
    } catch (e) {
      setError(e instanceof ApiError ? e.message : String(e));
    } finally {
      setBusy(false);
    }
  };
  return (
    <form className="jp-GpuBudget-askForm" noValidate onSubmit={ev => void submit(ev)}>
      <label>
        Project{' '}
        <select value={project} onChange={e => setProject(e.target.value)}>
          {props.projects.map(p => (
            <option key={p} value={p}>
              {p}
            </option>
          ))}
        </select>
      </label>
      <label>
        More GPU-hours per window{' '}
        <input
          className="jp-GpuBudget-askHours"
          type="number"
          min="0"
          step="any"
          value={hours}
          onChange={e => setHours(e.target.value)}
        />
      </label>
      <label>
        What for{' '}
        <textarea
          className="jp-GpuBudget-askReason"
          maxLength={2000}
          value={reason}
          onChange={e => setReason(e.target.value)}
        />
      </label>
      {error && (
        <div className="jp-GpuBudget-error" role="alert">
          {error}
        </div>
      )}
      <button className="jp-GpuBudget-button" type="submit" disabled={busy}>
        Send to the project's managers
      </button>{' '}
      <button className="jp-GpuBudget-button" type="button" onClick={() => setOpen(false)}>
        Cancel
      </button>
    </form>
  );
}

/** My week, this session's live utilisation, and my requests for more budget. */
export function MyWeekSection(props: { model: BudgetModel }) {
  const model = props.model;
  const info = model.snapshot.info;
  const features = (info?.features ?? {}) as Record<string, boolean | undefined>;
  const client = React.useMemo(() => new MyWeekClient(model.api), [model]);
  const [state, setState] = React.useState<IState>({
    week: null,
    util: null,
    mine: [],
    error: null
  });
  const [sent, setSent] = React.useState<string | null>(null);
  const session = info?.session ?? null;
  const load = React.useCallback(async () => {
    const tz = Intl.DateTimeFormat().resolvedOptions().timeZone || 'UTC';
    try {
      const [week, util, mine] = await Promise.all([
        features.my_week ? client.week(tz) : Promise.resolve(null),
        features.my_week && session ? client.utilisation(session) : Promise.resolve(null),
        features.budget_requests ? client.requests() : Promise.resolve({ requests: [] })
      ]);
      setState({
        week,
        util,
        // a manager also sees the requests they may answer: here only their own (the
        // service's name for them, as the week says it)
        mine: mine.requests.filter(r => r.user === (week?.user ?? info?.user)),
        error: null
      });
    } catch (e) {
      setState(s => ({ ...s, error: e instanceof ApiError ? e.message : String(e) }));
    }
  }, [client, session, features.my_week, features.budget_requests, info?.user]);
  React.useEffect(() => {
    void load();
    const again = () => void load();
    model.changed.connect(again);
    return () => {
      model.changed.disconnect(again);
    };
  }, [model, load]);
  if (!features.my_week && !features.budget_requests) {
    return null;
  }
  const week = state.week;
  return (
    <section className="jp-GpuBudget-section jp-GpuBudget-myWeek" aria-labelledby="jp-GpuBudget-week">
      <h3 id="jp-GpuBudget-week" className="jp-GpuBudget-sectionTitle">
        My week
      </h3>
      {state.error && (
        <div className="jp-GpuBudget-error" role="alert">
          {state.error}
        </div>
      )}
      {week && (
        <dl>
          <div className="jp-GpuBudget-row jp-GpuBudget-weekTotal" title="Since Monday 00:00">
            <dt>This week</dt>
            <dd>{weekWords(week.totals)}</dd>
          </div>
          {week.projects.map(p => (
            <div className="jp-GpuBudget-row jp-GpuBudget-weekProject" key={p.project}>
              <dt>{p.project}</dt>
              <dd>{weekWords(p)}</dd>
            </div>
          ))}
          {session && (
            <div className="jp-GpuBudget-row jp-GpuBudget-liveUtil">
              <dt>GPU now</dt>
              <dd>{utilisationWords(state.util)}</dd>
            </div>
          )}
          {session && (
            <div className="jp-GpuBudget-row jp-GpuBudget-gpuMemory">
              <dt>GPU memory</dt>
              <dd>
                {memoryWords(state.util).map(line => (
                  <div key={line}>{line}</div>
                ))}
              </dd>
            </div>
          )}
        </dl>
      )}
      {features.budget_requests && (
        <>
          <RequestForm
            projects={week ? week.projects.map(p => p.project) : []}
            client={client}
            onDone={r => {
              setSent(
                `Asked for ${r.gpu_hours} more GPU-hours for ${r.project}; ` +
                  `waiting for ${(r.notified ?? []).join(', ') || 'the administrators'}.`
              );
              void load();
            }}
          />
          {sent && <p className="jp-GpuBudget-muted jp-GpuBudget-askSent">{sent}</p>}
          {state.mine.length > 0 && (
            <ul className="jp-GpuBudget-requests">
              {state.mine.slice(0, 5).map(r => (
                <li key={r.id} className={`jp-GpuBudget-request jp-GpuBudget-request-${r.state}`}>
                  {r.gpu_hours} GPU-h for {r.project}: {r.state}
                  {r.decided_by ? ` by ${r.decided_by}` : ''}
                  {r.note ? ` (“${r.note}”)` : ''}
                </li>
              ))}
            </ul>
          )}
        </>
      )}
    </section>
  );
}
