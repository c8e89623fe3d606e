import { describe, expect, it } from 'vitest';

import { GpuBudgetClient } from '../src/api';
import {
  IUtilisation,
  MyWeekClient,
  requestBody,
  memoryWords,
  utilisationWords,
  weekWords
} from '../src/myweek';

const util = (o: Partial<IUtilisation>): IUtilisation => ({
  session: 's1',
  status: 'live',
  utilisation: 0.37,
  average: 0.6,
  at: 1,
  age_s: 5,
  source: 'device',
  message: '',
  ...o
});

describe('my week in words', () => {
  it('says charged and busy, and unknown (never 0) where nothing measured', () => {
    const f = { charged_gpu_h: 12.34, measured_gpu_h: 10, idle_gpu_h: 5.9 };
    expect(weekWords({ ...f, busy_gpu_h: 4.1, idle_share: 0.59 })).toBe(
      '12.3 GPU-h charged, 4.1 busy'
    );
    expect(
      weekWords({ charged_gpu_h: 2, busy_gpu_h: null, measured_gpu_h: 0, idle_gpu_h: null, idle_share: null })
    ).toBe('2.0 GPU-h charged, busy unknown');
  });

  it('says the live utilisation, stale or unknown', () => {
    expect(utilisationWords(util({}))).toBe('37 % busy now; 60 % since it started');
    expect(utilisationWords(util({ status: 'stale', age_s: 400 }))).toBe(
      '37 % busy (last sample 400 s ago)'
    );
    expect(utilisationWords(util({ status: 'unknown', utilisation: null }))).toMatch(/^unknown/);
    expect(utilisationWords(null)).toBe('–');
  });
});

describe('GPU memory in words', () => {
  it('says used of total per GPU, and unknown (never 0) where nothing reads it', () => {
    const gib = 2 ** 30;
    const gpu = (g: string, used: number, total: number, shared = false) => ({
      gpu: g, used_bytes: used * gib, total_bytes: total * gib, shared
    });
    expect(memoryWords(util({ memory: [gpu('0', 12.1, 80)] }))).toEqual(['12.1 of 80 GiB']);
    expect(memoryWords(util({ memory: [gpu('0', 3, 79.6), gpu('1', 0, 80)] }))).toEqual([
      '3 of 79.6 GiB (GPU 0)',
      '0 of 80 GiB (GPU 1)'
    ]);
    expect(memoryWords(util({ memory: [gpu('2', 40, 141, true)] }))).toEqual([
      '40 of 141 GiB, the whole shared GPU'
    ]);
    expect(memoryWords(util({ memory: null }))[0]).toMatch(/^unknown/);
    expect(memoryWords(util({}))[0]).toMatch(/^unknown/);
    expect(memoryWords(null)).toEqual(['–']);
  });
});

describe('asking for more GPU-hours', () => {
  it('checks the form before sending', () => {
    expect(requestBody('lattice', '10', ' thesis ')).toEqual({
      body: { project: 'lattice', gpu_hours: 10, reason: 'thesis' }
    });
    expect(requestBody('lattice', '-1', 'x')).toEqual({ error: 'GPU-hours: a number above 0.' });
    expect(requestBody('lattice', 'ten', 'x')).toHaveProperty('error');
    expect(requestBody('lattice', '5', '  ')).toHaveProperty('error');
    expect(requestBody('', '5', 'x')).toHaveProperty('error');
  });

  it('posts the request through the server extension and reads the service error', async () => {
    const calls: Array<[string, RequestInit | undefined]> = [];
    const client = new MyWeekClient(
      new GpuBudgetClient(async (path, init) => {
        calls.push([path, init]);
        if (init?.method === 'POST') {
          return new Response(JSON.stringify({ message: 'project: no project', field: 'project' }), {
            status: 400
          });
        }
        return new Response(JSON.stringify({ requests: [] }), { status: 200 });
      })
    );
    await client.requests();
    await expect(client.ask({ project: 'x', gpu_hours: 1, reason: 'y' })).rejects.toThrow(
      'project: no project'
    );
    await client.week('Europe/Berlin').catch(() => null);
    expect(calls.map(c => c[0])).toEqual([
      'v1/budget-requests?state=pending,granted,declined',
      'v1/budget-requests',
      'v1/me/week?tz=Europe%2FBerlin'
    ]);
    expect(JSON.parse(String(calls[1][1]?.body))).toEqual({ project: 'x', gpu_hours: 1, reason: 'y' });
  });
});
