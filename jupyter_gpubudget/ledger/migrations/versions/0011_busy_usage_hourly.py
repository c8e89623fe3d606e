"""busy GPU time per charge interval (``busy_charges``) and charged / busy GPU time per
project, per user, per hour and per UTC day (``usage_hourly``, ``usage_daily``), kept past the usage window for reports, with
preemptions per day and waits per project, day and kind in half-octave buckets (``wait_daily``);
filled with the charged history so far (nothing measured it: its busy time is unknown)

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'busy_charges',
        sa.Column('charge', sa.Integer(), sa.ForeignKey('charge_intervals.id'),
                  primary_key=True),
        sa.Column('workload', sa.String(64), nullable=False),
        sa.Column('project', sa.String(200), nullable=False),
        sa.Column('user', sa.String(200), nullable=False),
        sa.Column('kind', sa.String(20), nullable=False, server_default=''),
        sa.Column('measured_ms', sa.Float(), nullable=False, server_default='0'),
        sa.Column('busy_ms', sa.Float(), nullable=False, server_default='0'),
        sa.Column('first', sa.Float(), nullable=False),
        sa.Column('last', sa.Float(), nullable=False),
        sa.Column('source', sa.String(20), nullable=False, server_default=''))
    op.create_index('ix_busy_charges_workload', 'busy_charges', ['workload'])
    op.create_index('ix_busy_charges_kind_last', 'busy_charges',
                    ['kind', 'last', 'first', 'project', 'user', 'workload', 'measured_ms',
                     'busy_ms'])
    # the keys start with the time: a period's rows are one range of it
    hourly = op.create_table(
        'usage_hourly',
        sa.Column('hour', sa.BigInteger(), nullable=False),
        sa.Column('project', sa.String(200), nullable=False),
        sa.Column('user', sa.String(200), nullable=False),
        sa.Column('hod', sa.Integer(), nullable=False, server_default='0'),
        sa.Column('charged_ms', sa.Float(), nullable=False, server_default='0'),
        sa.Column('measured_ms', sa.Float(), nullable=False, server_default='0'),
        sa.Column('busy_ms', sa.Float(), nullable=False, server_default='0'),
        sa.PrimaryKeyConstraint('hour', 'project', 'user'))
    op.create_index('ix_usage_hourly_hod', 'usage_hourly', ['hod', 'hour'])
    daily = op.create_table(
        'usage_daily',
        sa.Column('day', sa.Integer(), nullable=False),
        sa.Column('project', sa.String(200), nullable=False),
        sa.Column('user', sa.String(200), nullable=False),
        sa.Column('charged_ms', sa.Float(), nullable=False, server_default='0'),
        sa.Column('measured_ms', sa.Float(), nullable=False, server_default='0'),
        sa.Column('busy_ms', sa.Float(), nullable=False, server_default='0'),
        sa.Column('preemptions', sa.Integer(), nullable=False, server_default='0'),
        sa.PrimaryKeyConstraint('day', 'project', 'user'))
    waits = op.create_table(
        'wait_daily',
        sa.Column('day', sa.Integer(), nullable=False),
        sa.Column('project', sa.String(200), nullable=False),
        sa.Column('kind', sa.String(20), nullable=False),
        *(sa.Column(f'w{b}', sa.Integer(), nullable=True) for b in range(40)),
        sa.PrimaryKeyConstraint('day', 'project', 'kind'))
    from jupyter_gpubudget.ledger.busy import wait_bucket
    from jupyter_gpubudget.ledger.rollups import split_by_hour

    buckets: dict[tuple[str, str, int], float] = {}
    preempted: dict[tuple[str, str, int], int] = {}
    waited: dict[tuple[str, int, str], dict[str, int]] = {}
    rows = op.get_bind().execute(sa.text(
        'SELECT c.project, c."user", c.milli, c.start, c."end", c.closed_by, c.seq, '
        'w.submitted_at, w.kind, p."end" FROM charge_intervals c '
        'JOIN workloads w ON w.id = c.workload LEFT JOIN charge_intervals p '
        'ON p.workload = c.workload AND p.seq = c.seq - 1 WHERE c."end" IS NOT NULL'))
    for project, user, milli, start, end, closed_by, seq, submitted, kind, prev in rows:
        for hour, ms, _stop in split_by_hour(milli, start, max(end, start)):
            key = (project, user, int(hour))
            buckets[key] = buckets.get(key, 0.0) + ms
        if closed_by == 'preempt':
            k = (project, user, int(max(end, start)) // 86400)
            preempted[k] = preempted.get(k, 0) + 1
        since = submitted if seq == 1 or prev is None else prev
        col = f'w{wait_bucket(start - since)}'
        row = waited.setdefault((project, int(start) // 86400, kind), {})
        row[col] = row.get(col, 0) + 1
    items = [{'project': p, 'user': u, 'hour': h, 'hod': h % 86400 // 3600, 'charged_ms': v,
              'measured_ms': 0.0, 'busy_ms': 0.0} for (p, u, h), v in buckets.items()]
    for i in range(0, len(items), 10000):
        op.bulk_insert(hourly, items[i:i + 10000])
    days: dict[tuple[str, str, int], float] = {}
    for (p, u, h), v in buckets.items():
        days[(p, u, h // 86400)] = days.get((p, u, h // 86400), 0.0) + v
    for k in preempted:
        days.setdefault(k, 0.0)
    items = [{'project': p, 'user': u, 'day': d, 'charged_ms': v, 'measured_ms': 0.0,
              'busy_ms': 0.0, 'preemptions': preempted.get((p, u, d), 0)}
             for (p, u, d), v in days.items()]
    for i in range(0, len(items), 10000):
        op.bulk_insert(daily, items[i:i + 10000])
    items = [{'project': p, 'day': d, 'kind': k, **{f'w{b}': n.get(f'w{b}', 0)
                                                    for b in range(40)}}
             for (p, d, k), n in waited.items()]
    for i in range(0, len(items), 10000):
        op.bulk_insert(waits, items[i:i + 10000])


def downgrade() -> None:
    op.drop_table('wait_daily')
    op.drop_table('usage_daily')
    op.drop_index('ix_usage_hourly_hod', table_name='usage_hourly')
    op.drop_table('usage_hourly')
    op.drop_index('ix_busy_charges_kind_last', table_name='busy_charges')
    op.drop_index('ix_busy_charges_workload', table_name='busy_charges')
    op.drop_table('busy_charges')
