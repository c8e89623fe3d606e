import type { IAccount, IInfo, ISession, IWorkload } from '../src/api';
import { emptySnapshot, ISnapshot } from '../src/state';

/** Shapes as the service's /api/v1 answers them (jupyter_gpubudget/service/views.py). */
export function workload(over: Partial<IWorkload> = {}): IWorkload {
  return {
    id: 'w1',
    name: '',
    project: 'lattice-qcd',
    user: 'alice',
    kind: 'batch',
    state: 'running',
    request: { kind: 'gpu', gpus: 1 },
    placement: [{ node: 'h100-a', gpu: 0, kind: 'gpu', milli: 1000 }],
    submitted_at: 1000,
    started_at: 1000,
    ended_at: null,
    backed: true,
    protected_until: 4600,
    protected_left_s: 3600,
    queue_position: null,
    predicted_start: null,
    min_runtime: 3600,
    resumable: false,
    time_limit: null,
    preemptions: 0,
    exit_code: null,
    reason: '',
    backend: 'local',
    ...over
  };
}

export function session(over: Partial<ISession> = {}): ISession {
  return {
    ...workload({
      id: 's1',
      kind: 'interactive',
      backend: 'hub',
      placement: [{ node: 'h100-a', gpu: 6, kind: 'mig', milli: 143, profile: '1g.10gb', mig_start: 0 }]
    }),
    preempt_requested: null,
    idle_reported: null,
    blocked_by: [],
    inventory: 'declared',
    ...over
  };
}

export function account(over: Partial<IAccount> = {}): IAccount {
  return {
    name: 'lattice-qcd',
    parent: 'physics',
    project: true,
    children: [],
    members: ['alice'],
    managers: [],
    grant: null,
    usage_hours: 12,
    effective_grant_hours: 60,
    standing: 0.2,
    ...over
  };
}

export function info(over: Partial<IInfo> = {}): IInfo {
  return {
    user: 'alice',
    session: 's1',
    project: 'lattice-qcd',
    server_time: 2000,
    service: { configured: true, reachable: true, url: 'http://127.0.0.1:1/services/gpubudget', message: null },
    features: { usage_daily: false, job_log: false, snapshots: false },
    ...over
  };
}

/** A snapshot received at browser time `at` (ms), the service clock `offsetMs` ahead. */
export function snapshotOf(s: ISession | null, at: number, offsetMs = 0): ISnapshot {
  return { ...emptySnapshot(at), receivedAt: at, offsetMs, session: s, info: info() };
}
