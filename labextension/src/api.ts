/**
 * The browser's view of the gpubudget service, through the user's own Jupyter server.
 *
 * Every request goes to `<base_url>gpubudget/api/...` on the Jupyter server (the server
 * extension `jupyter_gpubudget.serverext`), which forwards an allow-list of service paths
 * with the server's own token: no token ever reaches the browser.
 *
 * The transport is injected (`Fetcher`), so the client is tested without JupyterLab; in the
 * lab it is `ServerConnection.makeRequest` (cookies + XSRF as JupyterLab does everywhere).
 */

/** Seconds since the epoch (the service's clock). */
export type Epoch = number;

export interface IPlacementSlice {
  node: string;
  gpu: number;
  kind: 'gpu' | 'mig' | 'mps' | 'cpu' | string;
  milli: number;
  profile?: string | null;
  mig_start?: number;
  gpu_memory_mib?: number;
}

export interface IWorkload {
  id: string;
  name: string;
  project: string;
  user: string;
  kind: 'interactive' | 'batch' | 'debug' | string;
  state: 'pending' | 'running' | 'done' | 'failed' | 'cancelled' | 'preempted' | string;
  request: Record<string, unknown> | null;
  placement: IPlacementSlice[] | null;
  submitted_at: Epoch;
  started_at: Epoch | null;
  ended_at: Epoch | null;
  backed: boolean;
  protected_until: Epoch | null;
  protected_left_s: number | null;
  queue_position: number | null;
  predicted_start: Epoch | null;
  predicted_start_kind?: 'estimate' | string;
  min_runtime: number;
  resumable: boolean;
  time_limit: number | null;
  preemptions: number;
  exit_code: number | null;
  reason: string;
  backend: string;
  /** The cluster it runs on (or named, while it waits); 'default' where there is one. */
  cluster?: string | null;
  /** GPU-hours charged so far (proposed for the service; computed here when absent). */
  charged_gpu_hours?: number | null;
  /** Running work: whether the scheduler is likely to preempt it, about when, and why. */
  preemption_forecast?: IPreemptionForecast | null;
}

/** The service's outlook for running work, given the work queued now. */
export interface IPreemptionForecast {
  likely: boolean;
  at: Epoch | null;
  at_text?: string | null;
  for_workload?: string | null;
  for_project?: string | null;
  /** Why, in words ("its node n1 is being drained for maintenance"). */
  reason?: string | null;
}

/** GET /workloads/me/ended: one of my ended workloads and what it cost its project. */
export interface IEndedWorkload extends IWorkload {
  charged_gpu_hours: number;
  /** Seconds it ran (ended_at - started_at). */
  ran_s: number;
}

export interface ISession extends IWorkload {
  preempt_requested: string | null;
  idle_reported: Epoch | null;
  blocked_by?: string[];
  inventory?: 'declared' | 'nvml' | string;
  /** When the server will be stopped after a preemption was asked for. */
  preempt_deadline?: Epoch | null;
  /** When the spawner saves the kernels and stops the server: the lab's notice. */
  preempt_stop_at?: Epoch | null;
  /** Its newest snapshot (or of the session it resumed). */
  snapshot?: ISnapshotSet | null;
  snapshot_count?: number;
  /** The session this one resumes, and the snapshot it restores. */
  resumes?: { session: string; snapshot: string; reason: string | null; at: Epoch } | null;
  /** What its restore brought back. */
  restored?: IRestoreReport | null;
  /** Kernel state lost: no snapshot could be taken in the grace period. */
  snapshot_lost?: { reason: string; at: Epoch } | null;
  hibernated?: { snapshot: string; at: Epoch } | null;
}

/** One kernel of a snapshot: what it saved (or why not). */
export interface ISnapshotKernel {
  kernel_name: string;
  notebooks: string[];
  method: 'criu' | 'namespace' | string | null;
  saved: boolean;
  error: string | null;
  variables: number;
  /** Variables that could not be saved, and why. */
  unsaved: Record<string, string>;
  raw_bytes: number;
  stored_bytes: number;
}

/** A snapshot: every kernel of the server, saved together. */
export interface ISnapshotSet {
  id: string;
  session: string;
  project: string;
  created_at: Epoch;
  method: string;
  status: 'ok' | 'bad' | 'deleted' | string;
  problem: string;
  stored_bytes: number;
  raw_bytes: number;
  seconds: number;
  reason: 'user' | 'preempt' | 'hibernate' | string | null;
  kernels: ISnapshotKernel[];
  saved: number | null;
  count: number | null;
}

/** What a restore brought back, kernel by kernel. */
export interface IRestoredKernel {
  kernel_name: string;
  notebooks: string[];
  method: string | null;
  /** CRIU: the kernel's processes came back as they were. */
  everything: boolean;
  restored: string[];
  recomputed: Record<string, string>;
  lost: Record<string, string>;
  unsaved?: Record<string, string>;
  notes: string[];
  error: string | null;
}

export interface IRestoreReport {
  snapshot: string | null;
  asked: string | null;
  summary: string;
  kernels: IRestoredKernel[];
  skipped: Array<{ id: string; problem: string }>;
  taken_at: Epoch | null;
  error: string | null;
  at: Epoch;
}

/** GET sessions/{id}/snapshots: this session's snapshots and the store's rules. */
export interface ISnapshotList {
  session: string;
  snapshots: ISnapshotSet[];
  keep_last: number;
  quota_bytes: number | null;
  project_bytes: number;
}

/** What this server answers when it took a snapshot. */
export interface ITakenSnapshot {
  id: string;
  created_at: Epoch;
  methods: string[];
  kernels: number;
  saved: number;
  stored_bytes: number;
  raw_bytes: number;
  status: string;
}

/** GET gpubudget/api/snapshots: what this server can do. */
export interface IServerSnapshots {
  session: string | null;
  enabled: boolean;
  problem: string | null;
  methods: string[];
  kernels: number;
  taking: boolean;
}

export interface IGrant {
  version: number;
  grant_hours: number | null;
  share_pct: number | null;
  changed_by: string;
  changed_at: Epoch;
  source: string;
  note: string | null;
}

export interface IAccount {
  name: string;
  parent: string | null;
  project: boolean;
  children: string[];
  members: string[];
  managers: string[];
  grant: IGrant | null;
  usage_hours: number | null;
  effective_grant_hours: number | null;
  standing: number | null;
  /** The caller's own limit as a member of this project, where a manager set one. */
  my_limit?: IMemberLimit;
}

/** A member's limit in a project and where they stand against it (last cycle). */
export interface IMemberLimit {
  gpu_hours: number | null;
  gpus: number | null;
  used_hours: number | null;
  running_gpus: number | null;
  over: boolean;
  /** e.g. "over your member limit in lattice: 212 of 200 GPU-h — runs unbacked" */
  text: string | null;
}

export interface IUsage {
  account: string;
  usage_hours: number | null;
  grant_hours: number | null;
  standing: number | null;
  window_s: number;
  half_life_s: number | null;
  running: number;
  pending: number;
  preemptions: number;
  computed_at: Epoch | null;
}

/** GET /accounts/{name}/usage/daily?tz=<IANA zone>. */
export interface IUsageDaily {
  account: string;
  tz: string;
  window_s: number;
  days: Array<{ date: string; start: Epoch; end: Epoch; gpu_hours: number }>;
  computed_at: Epoch;
}

/** GET /jobs/{id}/log[?offset=N&limit=B]. */
export interface IJobLog {
  id: string;
  attempt: number;
  offset: number;
  next_offset: number;
  size: number;
  text: string;
  truncated: boolean;
  state: string;
}

export interface INotice {
  kind: 'preempt' | 'idle' | string;
  workload: string;
  name: string;
  project: string;
  at: Epoch;
  /** The body again, for older sidebars. */
  reason: string;
  /** Words for people: a one-line title and the body as written (no ids in either). */
  title?: string;
  body?: string;
  /** Why, in one word: preempt, drain, cancel, idle, hibernate, time_limit, restore_failed, other. */
  cause?: string;
  /** The ids (workload, node, snapshot…), kept apart from the words. */
  details?: Record<string, string | number | boolean | null>;
  requeued: boolean;
  state: string;
}

/** One stretch of a session on its slice: one charge interval. */
export interface IHistorySegment {
  /** The session (workload) this segment ran as: a restored server is a new one. */
  workload: string;
  start: Epoch;
  /** null: still running. */
  end: Epoch | null;
  /** How it ended: preempted, hibernated, cancelled, stopped, ended (null: running). */
  ended: string | null;
  /** Why, in a few words ("node drained: fan failure"), where known. */
  why: string | null;
  placement: IPlacementSlice[];
  nodes: string[];
  gpu_hours: number;
}

/** GET /sessions/{id}/history: the server across preemptions and restores. */
export interface ISessionHistory {
  session: string;
  computed_at: Epoch;
  segments: IHistorySegment[];
  total_gpu_hours: number;
}

/** What the server extension says about itself (`GET gpubudget/api/info`). */
export interface IInfo {
  user: string | null;
  session: string | null;
  project: string | null;
  server_time: Epoch;
  service: {
    configured: boolean;
    reachable: boolean;
    url: string | null;
    message: string | null;
  };
  /** Optional parts of the service (absent: an older server extension that does not say). */
  features: { usage_daily: boolean; job_log: boolean; snapshots: boolean; session_history?: boolean };
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly field: string | null = null
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

/** `fetch`-like transport: path relative to `<base_url>gpubudget/api/`. */
export type Fetcher = (path: string, init?: RequestInit) => Promise<Response>;

const NAME = /^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,199}$/;

function seg(value: string, what: string): string {
  if (!NAME.test(value)) {
    throw new ApiError(400, `${what}: ${JSON.stringify(value)} is not a valid name`, what);
  }
  return encodeURIComponent(value);
}

export class GpuBudgetClient {
  constructor(private readonly fetcher: Fetcher) {}

  /** JSON of a request; a non-2xx answer raises ApiError with the service's message. */
  async request<T>(path: string, init?: RequestInit): Promise<T> {
    let response: Response;
    try {
      response = await this.fetcher(path, init);
    } catch (e) {
      throw new ApiError(0, `the Jupyter server cannot be reached (${String(e)})`);
    }
    const text = await response.text();
    let body: unknown = null;
    if (text) {
      try {
        body = JSON.parse(text);
      } catch {
        body = null;
      }
    }
    if (!response.ok) {
      const b = (body ?? {}) as { message?: unknown; field?: unknown };
      const message =
        typeof b.message === 'string' && b.message
          ? b.message
          : `${response.status} ${response.statusText || 'error'}`.trim();
      throw new ApiError(
        response.status,
        message,
        typeof b.field === 'string' ? b.field : null
      );
    }
    return body as T;
  }

  /** Like `request`, but an endpoint the service does not have yet gives `null`. */
  async optional<T>(path: string, init?: RequestInit): Promise<T | null> {
    try {
      return await this.request<T>(path, init);
    } catch (e) {
      if (e instanceof ApiError && e.status === 404 && /no such endpoint/i.test(e.message)) {
        return null;
      }
      throw e;
    }
  }

  info(): Promise<IInfo> {
    return this.request<IInfo>('info');
  }

  async session(id: string): Promise<ISession> {
    return this.request<ISession>(`v1/sessions/${seg(id, 'session')}`);
  }

  accounts(): Promise<IAccount[]> {
    return this.request<{ accounts: IAccount[] }>('v1/accounts').then(r => r.accounts);
  }

  async usage(account: string): Promise<IUsage> {
    return this.request<IUsage>(`v1/accounts/${seg(account, 'account')}/usage`);
  }

  async usageDaily(account: string, tz: string): Promise<IUsageDaily | null> {
    return this.optional<IUsageDaily>(
      `v1/accounts/${seg(account, 'account')}/usage/daily?tz=${encodeURIComponent(tz)}`
    );
  }

  myWork(states: string[] = ['pending', 'running']): Promise<IWorkload[]> {
    const q = states.length ? `?state=${states.map(encodeURIComponent).join(',')}` : '';
    return this.request<{ workloads: IWorkload[] }>(`v1/workloads/me${q}`).then(
      r => r.workloads
    );
  }

  /** My last ended sessions and jobs with their cost, newest first (null: not served). */
  async ended(limit = 5): Promise<IEndedWorkload[] | null> {
    const r = await this.optional<{ workloads: IEndedWorkload[] }>(
      `v1/workloads/me/ended?limit=${Math.max(1, Math.min(50, Math.floor(limit)))}`
    );
    return r ? r.workloads : null;
  }

  notices(): Promise<INotice[]> {
    return this.request<{ notices: INotice[] }>('v1/notices').then(r => r.notices);
  }

  /** The end of a job's output (the service's last 64 KiB), or from `offset` on. */
  async jobLog(id: string, offset?: number): Promise<IJobLog | null> {
    const q = offset === undefined ? '' : `?offset=${Math.max(0, Math.floor(offset))}`;
    return this.optional<IJobLog>(`v1/jobs/${seg(id, 'job')}/log${q}`);
  }

  async cancelJob(id: string): Promise<IWorkload> {
    return this.request<IWorkload>(`v1/jobs/${seg(id, 'job')}`, { method: 'DELETE' });
  }

  /** Leave the queue: only a queued session can be cancelled from the lab. */
  async cancelSession(id: string): Promise<ISession> {
    return this.request<ISession>(`v1/sessions/${seg(id, 'session')}`, { method: 'DELETE' });
  }

  /** "Save and release now": let the preemption of this session go ahead now. */
  async release(id: string): Promise<ISession> {
    return this.request<ISession>(`v1/sessions/${seg(id, 'session')}/release`, {
      method: 'POST'
    });
  }

  /** This session's snapshots (and those of the session it resumed), via the service. */
  /** The session's segments across preemptions, with what each cost. */
  async history(id: string): Promise<ISessionHistory> {
    return this.request<ISessionHistory>(`v1/sessions/${seg(id, 'session')}/history`);
  }

  async snapshots(id: string): Promise<ISnapshotList> {
    return this.request<ISnapshotList>(`v1/sessions/${seg(id, 'session')}/snapshots`);
  }

  /** What this server can do about snapshots (its own endpoint). */
  serverSnapshots(): Promise<IServerSnapshots> {
    return this.request<IServerSnapshots>('snapshots');
  }

  /** "Snapshot now": every kernel of this server; they run on. */
  snapshotNow(): Promise<ITakenSnapshot> {
    return this.request<ITakenSnapshot>('snapshots', {
      method: 'POST',
      body: JSON.stringify({ reason: 'user', freeze: false }),
      headers: { 'Content-Type': 'application/json' }
    });
  }

  /** Restore a snapshot into this server: its notebooks get the restored kernels. */
  restore(snapshot: string): Promise<IRestoreReport> {
    if (!SNAPSHOT_ID.test(snapshot)) {
      return Promise.reject(
        new ApiError(400, `snapshot: ${JSON.stringify(snapshot)} is not a snapshot id`, 'snapshot')
      );
    }
    return this.request<IRestoreReport>('restore', {
      method: 'POST',
      body: JSON.stringify({ snapshot }),
      headers: { 'Content-Type': 'application/json' }
    });
  }
}

const SNAPSHOT_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,47}--[0-9a-f]{11,13}-[0-9a-f]{6}$/;
