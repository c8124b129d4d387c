"""Spark input partitions: everything a worker needs to read one extent range by itself
(workers are separate processes that never talk to the driver; they talk to the
frontend only to renew a stale read grant)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING

from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import StructType

from cherami.errors import CheramiError
from cherami.spark.access import Credential, GrantSource
from cherami.spark.schema import RecordFilter, arrow_batches
from cherami.spark.storereader import DataLost, StoreReader
from cherami.wire import tls

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("cherami.spark.partitions")


class ExtentRange(InputPartition):
    """Sequence numbers ``first_seq`` up to (not including) ``end_seq`` of a plain extent;
    ``end_seq`` 0 reads everything the replica holds (timer extents in batch reads); with
    ``due``, the records of a timer extent due from ``first_seq`` up to (not including)
    ``end_seq``, both in epoch milliseconds (timer extents in streams)."""

    def __init__(
        self,
        extent: str,
        stores: list[str],
        first_seq: int,
        end_seq: int,
        credential: Credential,
        renewer: GrantSource | None = None,
        keep: RecordFilter | None = None,
        fail_on_data_loss: bool = True,
        due: bool = False,
    ) -> None:
        super().__init__(extent)
        self.extent = extent
        self.stores = stores
        self.first_seq = first_seq
        self.end_seq = end_seq
        self.keep = keep
        self.fail_on_data_loss = fail_on_data_loss
        self.due = due  # a timer extent: first_seq and end_seq are due times (ms)
        # made on the driver (spark/access.py): the extent's read grant, and where the
        # worker renews it if it went stale before or while it is read; or the driver's
        # cluster key when the driver has the secret
        self.credential = credential
        self.renewer = renewer
        # and the CA a TLS cluster's store hosts are verified with (the driver's
        # CHERAMI_TLS_CA), for replicas listed as tls://host:port
        self.tls_cadata = tls.ca_pem()

    def __repr__(self) -> str:
        return f"ExtentRange({self.extent}, {self.first_seq}..{self.end_seq})"

    def read(self, schema: StructType) -> Iterator[pa.RecordBatch]:
        renewer = self.renewer
        renew = None if renewer is None else partial(renewer.renew, self.extent)
        with StoreReader(
            self.stores, credential=self.credential, tls_cadata=self.tls_cadata, renew=renew
        ) as reader:
            if self.due:
                batches = reader.read_due(self.extent, self.first_seq, self.end_seq)
            elif self.end_seq:
                batches = reader.read_range(self.extent, self.first_seq, self.end_seq)
            else:
                batches = reader.read_all(self.extent)
            try:
                yield from arrow_batches(schema, self.extent, batches, self.keep)
            except DataLost as err:  # retention deleted the extent while it was read
                if self.fail_on_data_loss:
                    raise CheramiError(f"data loss: {err}; set failOnDataLoss=false to go on "
                                       "without it") from err  # fmt: skip
                log.warning("data loss: %s; going on", err)
