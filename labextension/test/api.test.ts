import { describe, expect, it } from 'vitest';

import { ApiError, Fetcher, GpuBudgetClient } from '../src/api';
import { BudgetModel } from '../src/model';
import { account, info, session, workload } from './fixtures';

type Route = (init: RequestInit | undefined) => Response | Promise<Response>;

/** A transport answering like the server extension does, recording every call. */
function transport(routes: Record<string, Route>) {
  const calls: Array<{ path: string; method: string }> = [];
  const fetcher: Fetcher = async (path, init) => {
    calls.push({ path, method: init?.method ?? 'GET' });
    const route = routes[path];
    if (!route) {
      return json(404, { status: 404, message: `no such endpoint /services/gpubudget/api/${path}` });
    }
    return route(init);
  };
  return { fetcher, calls };
}

function json(status: number, body: unknown): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { 'Content-Type': 'application/json' }
  });
}

describe('GpuBudgetClient', () => {
  it('asks the server extension for the right paths and methods', async () => {
    const t = transport({
      'v1/sessions/s1': () => json(200, session()),
      'v1/accounts': () => json(200, { accounts: [account()] }),
      'v1/workloads/me?state=pending,running': () => json(200, { user: 'alice', workloads: [workload()] }),
      'v1/notices': () => json(200, { notices: [] }),
      'v1/jobs/j-1': () => json(200, workload({ id: 'j-1', state: 'cancelled' })),
      'v1/accounts/lattice-qcd/usage/daily?tz=Europe%2FBerlin': () =>
        json(200, { account: 'lattice-qcd', tz: 'Europe/Berlin', window_s: 604800, days: [], computed_at: 1 })
    });
    const c = new GpuBudgetClient(t.fetcher);
    expect((await c.session('s1')).id).toBe('s1');
    expect((await c.accounts())[0].name).toBe('lattice-qcd');
    expect((await c.myWork()).length).toBe(1);
    expect(await c.notices()).toEqual([]);
    expect((await c.cancelJob('j-1')).state).toBe('cancelled');
    expect((await c.usageDaily('lattice-qcd', 'Europe/Berlin'))!.tz).toBe('Europe/Berlin');
    expect(t.calls.map(x => `${x.method} ${x.path}`)).toEqual([
      'GET v1/sessions/s1',
      'GET v1/accounts',
      'GET v1/workloads/me?state=pending,running',
      'GET v1/notices',
      'DELETE v1/jobs/j-1',
      'GET v1/accounts/lattice-qcd/usage/daily?tz=Europe%2FBerlin'
    ]);
  });

  it("raises the service's message and field", async () => {
    const t = transport({
      'v1/jobs/j-2': () => json(403, { status: 403, message: 'token lacks scope custom:gpubudget:submit' }),
      'v1/sessions/s9': () => json(400, { status: 400, message: 'state: bad', field: 'state' })
    });
    const c = new GpuBudgetClient(t.fetcher);
    await expect(c.cancelJob('j-2')).rejects.toMatchObject({
      status: 403,
      message: 'token lacks scope custom:gpubudget:submit'
    });
    await expect(c.session('s9')).rejects.toMatchObject({ status: 400, field: 'state' });
  });

  it('an endpoint the service does not have is null, any other 404 is an error', async () => {
    const t = transport({
      'v1/jobs/j-3/log': () => json(404, { status: 404, message: "no job 'j-3'" }),
      'v1/jobs/j-4/log?offset=12': () => json(200, { id: 'j-4', offset: 12, text: 'x' })
    });
    const c = new GpuBudgetClient(t.fetcher);
    expect(await c.usageDaily('astro', 'UTC')).toBeNull();
    await expect(c.jobLog('j-3')).rejects.toBeInstanceOf(ApiError);
    expect(await c.jobLog('j-4', 12.7)).toMatchObject({ offset: 12, text: 'x' });
  });

  it('refuses a bad name before sending anything', async () => {
    const t = transport({});
    const c = new GpuBudgetClient(t.fetcher);
    await expect(c.cancelJob('../../hub/api')).rejects.toMatchObject({ status: 400, field: 'job' });
    await expect(c.usage('a/b')).rejects.toMatchObject({ field: 'account' });
    expect(t.calls).toEqual([]);
  });

  it('a network failure or a non-JSON error page still gives a readable error', async () => {
    const down = new GpuBudgetClient(async () => {
      throw new TypeError('Failed to fetch');
    });
    await expect(down.info()).rejects.toMatchObject({ status: 0, message: /cannot be reached.*Failed to fetch/ });
    const html = new GpuBudgetClient(async () => new Response('<html>Bad Gateway</html>', { status: 502, statusText: 'Bad Gateway' }));
    await expect(html.info()).rejects.toMatchObject({ status: 502, message: '502 Bad Gateway' });
  });
});

describe('BudgetModel.refresh', () => {
  const base = () => ({
    info: () => json(200, info()),
    'v1/sessions/s1': () => json(200, session({ protected_left_s: 600 })),
    'v1/accounts': () =>
      json(200, {
        accounts: [
          account({ name: 'physics', parent: null, project: false, usage_hours: 30, effective_grant_hours: 100 }),
          account(),
          account({ name: 'astro' })
        ]
      }),
    'v1/workloads/me?state=pending,running': () =>
      json(200, {
        workloads: [session(), workload({ id: 'j1', state: 'pending', queue_position: 2 })]
      }),
    'v1/notices': () => json(200, { notices: [] }),
    'v1/accounts/lattice-qcd/usage': () =>
      json(200, { account: 'lattice-qcd', window_s: 604800, usage_hours: 12, grant_hours: 60 })
  });

  it('gathers one snapshot: clock offset, chain, other work, no optional calls', async () => {
    let now = 1_000_000; // browser ms; the server says 2000 s
    const t = transport(base());
    const m = new BudgetModel(new GpuBudgetClient(t.fetcher), () => (now += 10), 'UTC');
    const snap = await m.refresh();
    expect(snap.error).toBeNull();
    // calls to the clock: construction (+10), before info (+20), after info (+30)
    expect(snap.offsetMs).toBe(2000 * 1000 - 1_000_025);
    expect(snap.session!.id).toBe('s1');
    expect(snap.chain.map(a => a.name)).toEqual(['lattice-qcd', 'physics']);
    expect(snap.work.map(w => w.id)).toEqual(['j1']); // this session is not "other work"
    expect(snap.usage!.window_s).toBe(604800);
    expect(snap.daily).toBeNull();
    expect(t.calls.some(c => c.path.includes('usage/daily'))).toBe(false);
  });

  it('asks for the chart only when the service has it', async () => {
    const r = base();
    const t = transport({
      ...r,
      info: () => json(200, info({ features: { usage_daily: true, job_log: true, snapshots: false } })),
      'v1/accounts/lattice-qcd/usage/daily?tz=Asia%2FTokyo': () =>
        json(200, { account: 'lattice-qcd', tz: 'Asia/Tokyo', window_s: 604800, days: [{ date: '2026-11-03', start: 1, end: 2, gpu_hours: 1.5 }], computed_at: 2 })
    });
    const m = new BudgetModel(new GpuBudgetClient(t.fetcher), () => 1000, 'Asia/Tokyo');
    const snap = await m.refresh();
    expect(snap.daily!.days[0].gpu_hours).toBe(1.5);
  });

  it("asks for this server's history only when the service has it", async () => {
    const r = base();
    const history = { session: 's1', computed_at: 2000, segments: [], total_gpu_hours: 0 };
    const t = transport({
      ...r,
      info: () =>
        json(200, info({ features: { usage_daily: false, job_log: false, snapshots: false, session_history: true } })),
      'v1/sessions/s1/history': () => json(200, history)
    });
    const snap = await new BudgetModel(new GpuBudgetClient(t.fetcher), () => 1000, 'UTC').refresh();
    expect(snap.error).toBeNull();
    expect(snap.history).toEqual(history);
    const without = transport(base());
    const old = await new BudgetModel(new GpuBudgetClient(without.fetcher), () => 1000, 'UTC').refresh();
    expect(old.history).toBeNull();
    expect(without.calls.some(c => c.path.endsWith('/history'))).toBe(false);
  });

  it('keeps the last figures when a call fails, says why, and ages the countdown', async () => {
    let now = 1_000_000;
    const routes = base();
    const t = transport(routes);
    const m = new BudgetModel(new GpuBudgetClient(t.fetcher), () => now, 'UTC');
    await m.refresh();
    routes['v1/sessions/s1'] = () => json(503, { status: 503, message: 'JupyterHub cannot confirm the token right now; retry' });
    now += 60_000;
    const snap = await m.refresh();
    expect(snap.error).toBe('JupyterHub cannot confirm the token right now; retry');
    expect(snap.session!.protected_left_s).toBe(540);
    expect(snap.receivedAt).toBe(now);
  });

  it('an unconfigured server extension is an error in words, not a crash', async () => {
    const t = transport({
      info: () =>
        json(200, info({ service: { configured: false, reachable: false, url: null, message: 'no token: this server has no $JUPYTERHUB_API_TOKEN' } }))
    });
    const m = new BudgetModel(new GpuBudgetClient(t.fetcher), () => 1, 'UTC');
    const snap = await m.refresh();
    expect(snap.error).toMatch(/^no token/);
    expect(t.calls.length).toBe(1);
  });

  it('concurrent refreshes share one round of calls', async () => {
    const t = transport(base());
    const m = new BudgetModel(new GpuBudgetClient(t.fetcher), () => 1, 'UTC');
    await Promise.all([m.refresh(), m.refresh(), m.refresh()]);
    expect(t.calls.filter(c => c.path === 'info').length).toBe(1);
  });
});

describe('snapshots through the server', () => {
  it('snapshot now and restore go to the server itself; a bad id never leaves the browser', async () => {
    const bodies: unknown[] = [];
    const t = transport({
      snapshots: init => {
        bodies.push(JSON.parse(String(init?.body)));
        return json(200, { id: 's1--18f0000000a-abcdef', created_at: 1, methods: ['criu'],
                           kernels: 1, saved: 1, stored_bytes: 10, raw_bytes: 20, status: 'ok' });
      },
      restore: init => {
        bodies.push(JSON.parse(String(init?.body)));
        return json(200, { snapshot: 's1--18f0000000a-abcdef', kernels: [], skipped: [],
                           summary: 'x', asked: null, taken_at: 1, error: null, at: 2 });
      },
      'v1/sessions/s1/snapshots': () => json(200, { session: 's1', snapshots: [], keep_last: 3,
                                                     quota_bytes: null, project_bytes: 0 })
    });
    const c = new GpuBudgetClient(t.fetcher);
    expect((await c.snapshotNow()).saved).toBe(1);
    await c.restore('s1--18f0000000a-abcdef');
    expect((await c.snapshots('s1')).keep_last).toBe(3);
    expect(bodies).toEqual([{ reason: 'user', freeze: false }, { snapshot: 's1--18f0000000a-abcdef' }]);
    await expect(c.restore('../../etc/passwd')).rejects.toMatchObject({ status: 400, field: 'snapshot' });
    expect(t.calls.map(x => `${x.method} ${x.path}`)).toEqual([
      'POST snapshots', 'POST restore', 'GET v1/sessions/s1/snapshots'
    ]);
  });
});
