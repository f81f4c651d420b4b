"""Metric gpus: how many GPUs a worker's reported batch ran on

A multi-GPU machine type (a3-highgpu-2g, a4-highgpu-8g) trains one rank per GPU; its worker row reports the
node's batch and step time, and a calibration fits the step time at the batch one GPU ran (batch / gpus).
NULL on older rows: one GPU.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29 05:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('metrics', schema=None) as batch_op:
        batch_op.add_column(sa.Column('gpus', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('metrics', schema=None) as batch_op:
        batch_op.drop_column('gpus')
