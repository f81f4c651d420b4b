"""Metric labels: the runtime and precision a worker reported, and its own compute seconds per step

A PyTorch worker reports the batch it ran (it changes with elastic shrink / grow and re-splits), its runtime
(``pytorch-eager+torchjob``) and precision, and its compute seconds per step measured alone (in synchronous
training the window's step time is the slowest rank's, not this GPU's). Calibrations fit per label.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('metrics', schema=None) as batch_op:
        batch_op.add_column(sa.Column('runtime', sa.String(length=40), nullable=True))
        batch_op.add_column(sa.Column('precision', sa.String(length=8), nullable=True))
        batch_op.add_column(sa.Column('compute_s', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('metrics', schema=None) as batch_op:
        batch_op.drop_column('compute_s')
        batch_op.drop_column('precision')
        batch_op.drop_column('runtime')
