"""Messages the official Python package (talos-linux-api-v1-6-0) does not ship.

The package is generated from Talos' own ``api/`` protos. It has no ``cosi.resource`` service
(that lives in the separate cosi-project/specification repository) and no ``block`` resource
definitions (added to Talos after v1.6). These few messages are declared here, in the same
betterproto style as the package, from the field tables in
shared/reference/talos-wire.md section 3 -- NOT from our Rust ``proto/`` crate -- so that
the wire format is checked against a second, independent declaration.
"""

from dataclasses import dataclass
from datetime import datetime
from typing import AsyncIterator, Dict, List, Optional

import betterproto
import betterproto.lib.google.protobuf  # noqa: F401  (Timestamp is resolved by betterproto)
from betterproto.grpc.grpclib_client import ServiceStub


# --- cosi.resource (proto/v1alpha1/resource.proto, state.proto) ---


@dataclass(eq=False, repr=False)
class Metadata(betterproto.Message):
    namespace: str = betterproto.string_field(1)
    type: str = betterproto.string_field(2)
    id: str = betterproto.string_field(3)
    version: str = betterproto.string_field(4)
    owner: str = betterproto.string_field(5)
    phase: str = betterproto.string_field(6)
    created: datetime = betterproto.message_field(7)
    updated: datetime = betterproto.message_field(8)
    finalizers: List[str] = betterproto.string_field(9)
    labels: Dict[str, str] = betterproto.map_field(
        10, betterproto.TYPE_STRING, betterproto.TYPE_STRING
    )
    annotations: Dict[str, str] = betterproto.map_field(
        11, betterproto.TYPE_STRING, betterproto.TYPE_STRING
    )


@dataclass(eq=False, repr=False)
class Spec(betterproto.Message):
    proto_spec: bytes = betterproto.bytes_field(1)
    yaml_spec: str = betterproto.string_field(2)


@dataclass(eq=False, repr=False)
class Resource(betterproto.Message):
    metadata: Metadata = betterproto.message_field(1)
    spec: Spec = betterproto.message_field(2)


class LabelTermOperation(betterproto.Enum):
    EXISTS = 0
    EQUAL = 1
    NOT_EXISTS = 2
    IN = 3
    LT = 4
    LTE = 5
    LT_NUMERIC = 6
    LTE_NUMERIC = 7


@dataclass(eq=False, repr=False)
class LabelTerm(betterproto.Message):
    key: str = betterproto.string_field(1)
    op: LabelTermOperation = betterproto.enum_field(2)
    value: List[str] = betterproto.string_field(3)
    invert: bool = betterproto.bool_field(5)


@dataclass(eq=False, repr=False)
class LabelQuery(betterproto.Message):
    terms: List[LabelTerm] = betterproto.message_field(1)


@dataclass(eq=False, repr=False)
class IdQuery(betterproto.Message):
    regexp: str = betterproto.string_field(1)


@dataclass(eq=False, repr=False)
class ListOptions(betterproto.Message):
    label_query: List[LabelQuery] = betterproto.message_field(1)
    id_query: IdQuery = betterproto.message_field(2)


@dataclass(eq=False, repr=False)
class ListRequest(betterproto.Message):
    namespace: str = betterproto.string_field(1)
    type: str = betterproto.string_field(2)
    options: ListOptions = betterproto.message_field(3)


@dataclass(eq=False, repr=False)
class ListResponse(betterproto.Message):
    resource: Resource = betterproto.message_field(1)


@dataclass(eq=False, repr=False)
class GetOptions(betterproto.Message):
    pass


@dataclass(eq=False, repr=False)
class GetRequest(betterproto.Message):
    namespace: str = betterproto.string_field(1)
    type: str = betterproto.string_field(2)
    id: str = betterproto.string_field(3)
    options: GetOptions = betterproto.message_field(4)


@dataclass(eq=False, repr=False)
class GetResponse(betterproto.Message):
    resource: Resource = betterproto.message_field(1)


class StateStub(ServiceStub):
    """``cosi.resource.State``, the read half."""

    async def get(self, request: GetRequest, *, timeout: Optional[float] = None) -> GetResponse:
        return await self._unary_unary(
            "/cosi.resource.State/Get", request, GetResponse, timeout=timeout
        )

    async def list(
        self, request: ListRequest, *, timeout: Optional[float] = None
    ) -> AsyncIterator[ListResponse]:
        async for response in self._unary_stream(
            "/cosi.resource.State/List", request, ListResponse, timeout=timeout
        ):
            yield response


# --- talos.resource.definitions.block (api/resource/definitions/block/block.proto) ---


@dataclass(eq=False, repr=False)
class DiskSpec(betterproto.Message):
    size: int = betterproto.uint64_field(1)
    io_size: int = betterproto.uint64_field(2)
    sector_size: int = betterproto.uint64_field(3)
    readonly: bool = betterproto.bool_field(4)
    model: str = betterproto.string_field(5)
    serial: str = betterproto.string_field(6)
    modalias: str = betterproto.string_field(7)
    wwid: str = betterproto.string_field(8)
    bus_path: str = betterproto.string_field(9)
    sub_system: str = betterproto.string_field(10)
    transport: str = betterproto.string_field(11)
    rotational: bool = betterproto.bool_field(12)
    cdrom: bool = betterproto.bool_field(13)
    dev_path: str = betterproto.string_field(14)
    pretty_size: str = betterproto.string_field(15)
    secondary_disks: List[str] = betterproto.string_field(16)
    uuid: str = betterproto.string_field(17)
    symlinks: List[str] = betterproto.string_field(18)
