"""the devices each charge interval holds (``device_claims``: the ledger refuses a second
interval on a device while another holds it, and a successor's interval opens when its
victims' close), and the budgets file every replica must agree on, kept with the lease
(``service_leader.budgets_*``: its digest, where it came from and its text)

Revision ID: 0010
Revises: 0009
"""

import json

import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    claims = op.create_table(
        'device_claims',
        sa.Column('id', sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column('charge', sa.Integer(), sa.ForeignKey('charge_intervals.id'), nullable=False),
        sa.Column('workload', sa.String(64), nullable=False),
        sa.Column('node', sa.String(200), nullable=False),
        sa.Column('gpu', sa.Integer(), nullable=False),
        sa.Column('mig_start', sa.Integer(), nullable=False, server_default='-1'),
        sa.Column('milli', sa.Integer(), nullable=False),
        sa.Column('start', sa.Float(), nullable=False),
        sa.Column('end', sa.Float(), nullable=True),
    )
    op.create_index('ix_device_claims_device', 'device_claims', ['node', 'gpu', 'end'])
    op.create_index('ix_device_claims_charge', 'device_claims', ['charge'])
    # what runs now holds its devices from its open interval's start
    bind = op.get_bind()
    rows = bind.execute(sa.text(
        'SELECT c.id, c.workload, c.start, w.placement FROM charge_intervals c '
        'JOIN workloads w ON w.id = c.workload WHERE c."end" IS NULL')).all()
    out = []
    for cid, wid, start, placement in rows:
        if isinstance(placement, str):
            placement = json.loads(placement)
        for s in placement or []:
            if isinstance(s, dict) and isinstance(s.get('gpu'), int) and s['gpu'] >= 0:
                out.append({'charge': cid, 'workload': wid, 'node': str(s.get('node')),
                            'gpu': s['gpu'], 'mig_start': int(s.get('mig_start', -1)),
                            'milli': int(s.get('milli', 1000)), 'start': start, 'end': None})
    if out:
        op.bulk_insert(claims, out)
    with op.batch_alter_table('service_leader') as batch:
        batch.add_column(sa.Column('budgets_digest', sa.String(64), nullable=True))
        batch.add_column(sa.Column('budgets_source', sa.Text(), nullable=True))
        batch.add_column(sa.Column('budgets_text', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('service_leader') as batch:
        batch.drop_column('budgets_text')
        batch.drop_column('budgets_source')
        batch.drop_column('budgets_digest')
    op.drop_index('ix_device_claims_charge', table_name='device_claims')
    op.drop_index('ix_device_claims_device', table_name='device_claims')
    op.drop_table('device_claims')
