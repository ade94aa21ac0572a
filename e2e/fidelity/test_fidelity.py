"""Fidelity check: the Talos emulator against an INDEPENDENT client.

The client is the PyPI package ``talos-linux-api-v1-6-0`` (betterproto messages and grpclib
stubs generated from the official Talos ``api/`` protos), on Python's own TLS (OpenSSL) and
HTTP/2 (``h2``) stacks -- nothing here shares code with our Rust proto crate or client.
COSI messages, which the package lacks, come from ``cosi_messages.py``.

Every response is decoded with the official message classes and asserted field by field as
real Talos v1.13 would shape it; ``assert_no_unknown_fields`` additionally fails on any field
number the official message does not declare (a wrong field number in our protos shows up as
an unknown field here, or as a missing value in the field-by-field checks).

The tests run in file order against one emulated machine and share its state: maintenance
mode first, then ApplyConfiguration, then configured mode (mTLS, Bootstrap, Kubeconfig).

Environment (set by run.sh): FIDELITY_EMULATOR_BIN, FIDELITY_GEN_BIN, KONTINUUM_TESTBED_BIN.
"""

import asyncio
import base64
import gzip
import io
import ipaddress
import os
import re
import socket
import ssl
import subprocess
import tarfile
import time
import urllib.request
from pathlib import Path

import betterproto
import pytest
import yaml
from betterproto.lib.google.protobuf import Empty
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError

from talos_linux_api.v1_6_0.machine import (
    ApplyConfigurationRequest,
    ApplyConfigurationRequestMode,
    BootstrapRequest,
    MachineServiceStub,
    RebootRequest,
    RebootRequestMode,
    UpgradeRequest,
    UpgradeRequestRebootMode,
)
from talos_linux_api.v1_6_0.storage import DiskDiskType, StorageServiceStub
from talos_linux_api.v1_6_0.talos.resource.definitions.enums import (
    NethelpersFamily,
    NethelpersLinkType,
    NethelpersOperationalState,
    NethelpersScope,
)
from talos_linux_api.v1_6_0.talos.resource.definitions.network import (
    AddressStatusSpec,
    LinkStatusSpec,
)

import cosi_messages as cosi

# One machine on its own loopback address, on the real Talos and Kubernetes ports.
ADDRESS = "127.71.0.1"
TALOS_PORT = 50000
API_PORT = 6443
HOSTNAME = "fidelity-cp"
CLUSTER = "fidelity"  # the cluster name fidelity-gen puts in the config
TALOS_TAG = "v1.13.8"
RPC_TIMEOUT = 30.0
# How long the emulated machine stays away when Reboot or Upgrade reboots it.
REBOOT_DOWNTIME = 2.0
UPGRADE_TAG = "v1.13.9"

SEMVER = re.compile(r"^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$")
MAC = re.compile(r"^([0-9a-f]{2}:){5}[0-9a-f]{2}$")


# ---------------------------------------------------------------------------------------
# helpers


class Yaml12Loader(yaml.SafeLoader):
    """SafeLoader without YAML 1.1's sexagesimal numbers: Go's YAML (1.2) writes a MAC as
    plain `52:54:00:00:00:01`, which YAML 1.1 would read as a base-60 integer."""


Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers
            if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^[-+]?[0-9]+$"), list("-+0123456789"))
Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$"),
    list("-+0123456789."))


def load_yaml(text: str):
    return yaml.load(text, Loader=Yaml12Loader)


def assert_no_unknown_fields(message: betterproto.Message, path: str = "") -> None:
    """Fails if the emulator sent any field the official message does not declare."""
    name = path or type(message).__name__
    assert message._unknown_fields == b"", (
        f"{name}: fields unknown to the official proto: {message._unknown_fields!r}"
    )
    for field_name in message._betterproto.sorted_field_names:
        value = getattr(message, field_name)
        values = value if isinstance(value, list) else [value]
        for i, v in enumerate(values):
            if isinstance(v, betterproto.Message):
                assert_no_unknown_fields(v, f"{name}.{field_name}[{i}]")


def on_wire(message) -> bool:
    return message is not None and betterproto.serialized_on_wire(message)


def run(coro):
    return asyncio.run(coro)


def maintenance_tls() -> ssl.SSLContext:
    """What talosctl --insecure does: TLS, no verification, no client cert, ALPN h2."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["h2"])
    return ctx


def configured_tls(identity: dict) -> ssl.SSLContext:
    """mTLS as a talosctl with the admin talosconfig: server verified against the OS CA (the
    IP endpoint must be an IP SAN), the os:admin client certificate presented."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=identity["ca"])
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(identity["crt_file"], identity["key_file"])
    ctx.set_alpn_protocols(["h2"])
    return ctx


async def call(ssl_context, fn):
    channel = Channel(ADDRESS, TALOS_PORT, ssl=ssl_context)
    try:
        return await fn(channel)
    finally:
        channel.close()


async def collect(stream):
    return [item async for item in stream]


def cosi_list(namespace: str, resource_type: str):
    async def go(channel):
        state = cosi.StateStub(channel, timeout=RPC_TIMEOUT)
        return await collect(
            state.list(cosi.ListRequest(namespace=namespace, type=resource_type))
        )

    items = run(call(maintenance_tls(), go))
    for item in items:
        assert_no_unknown_fields(item)
    return [item.resource for item in items]


def check_cosi_metadata(resource, namespace: str, resource_type: str) -> None:
    md = resource.metadata
    assert md.namespace == namespace
    assert md.type == resource_type
    assert md.id
    # Go's NewMetadataFromProto: version is a decimal integer or "undefined"; phase is
    # "running" or "tearingDown".
    assert md.version == "undefined" or md.version.isdigit(), md.version
    assert md.phase in ("running", "tearingDown"), md.phase
    assert resource.spec.yaml_spec, "Talos fills yaml_spec (talosctl get prints it)"


# ---------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fidelity")


@pytest.fixture(scope="module", autouse=True)
def emulator(workdir):
    binary = os.environ["FIDELITY_EMULATOR_BIN"]
    assert os.environ.get("KONTINUUM_TESTBED_BIN"), "KONTINUUM_TESTBED_BIN is required"
    log_path = workdir / "emulator.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [
            binary,
            "--machines", "1",
            "--first-address", ADDRESS,
            "--port", str(TALOS_PORT),
            "--api-port", str(API_PORT),
            "--dir", str(workdir / "state"),
            "--control-addr", "127.0.0.1:0",
            "--reboot-downtime-ms", str(int(REBOOT_DOWNTIME * 1000)),
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        stdin=subprocess.DEVNULL,
    )
    lines = []
    try:
        while True:
            line = proc.stdout.readline().decode()
            if not line:
                raise RuntimeError(
                    f"emulator exited early: {lines}\n{log_path.read_text()[-4000:]}"
                )
            lines.append(line.strip())
            if line.startswith("control "):
                break
        assert lines[0] == f"listening {ADDRESS}:{TALOS_PORT}", lines
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        if os.environ.get("FIDELITY_SHOW_LOG"):
            print(log_path.read_text()[-8000:])


@pytest.fixture(scope="module")
def generated(workdir) -> dict:
    """A controlplane config and the admin talosconfig from our talos-config crate."""
    out = workdir / "generated"
    subprocess.run(
        [os.environ["FIDELITY_GEN_BIN"], str(out), ADDRESS, HOSTNAME],
        check=True,
        timeout=300,
    )
    talosconfig = load_yaml((out / "talosconfig").read_text())
    context = talosconfig["contexts"][talosconfig["context"]]
    assert context["endpoints"] == [ADDRESS]
    ca = base64.b64decode(context["ca"]).decode()
    crt = base64.b64decode(context["crt"]).decode()
    key = base64.b64decode(context["key"]).decode()
    # Talos labels its Ed25519 keys "ED25519 PRIVATE KEY" around a PKCS#8 body; OpenSSL only
    # takes "PRIVATE KEY" (the package's README says the same).
    key = key.replace("ED25519 PRIVATE KEY", "PRIVATE KEY")
    (out / "admin.crt").write_text(crt)
    (out / "admin.key").write_text(key)
    return {
        "config": (out / "controlplane.yaml").read_bytes(),
        "ca": ca,
        "crt_file": str(out / "admin.crt"),
        "key_file": str(out / "admin.key"),
    }


# ---------------------------------------------------------------------------------------
# maintenance mode


def test_maintenance_tls_negotiates_h2_without_client_cert():
    raw = socket.create_connection((ADDRESS, TALOS_PORT), timeout=10)
    with maintenance_tls().wrap_socket(raw, server_hostname=ADDRESS) as tls:
        assert tls.selected_alpn_protocol() == "h2"
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
        assert tls.getpeercert(binary_form=True), "a server certificate"


def test_maintenance_version():
    resp = run(call(maintenance_tls(), lambda ch: MachineServiceStub(ch).version(
        Empty(), timeout=RPC_TIMEOUT)))
    assert_no_unknown_fields(resp)
    assert len(resp.messages) == 1
    msg = resp.messages[0]
    assert not on_wire(msg.metadata), "a direct call carries no metadata"
    assert msg.version.tag == TALOS_TAG
    assert SEMVER.match(msg.version.tag), "talosctl's ClientVersionCheck parses the tag"
    assert re.fullmatch(r"[0-9a-f]{7,40}", msg.version.sha), msg.version.sha
    assert msg.version.go_version.startswith("go")
    assert msg.version.os == "linux"
    assert msg.version.arch in ("amd64", "arm64")
    assert msg.platform.name == "metal"
    assert msg.platform.mode == "metal"
    # v1.13 maintenance mode: no config yet, so features is unset.
    assert not on_wire(msg.features)


def test_cosi_links():
    ns, ty = "network", "LinkStatuses.net.talos.dev"
    resources = cosi_list(ns, ty)
    by_id = {r.metadata.id: r for r in resources}
    assert set(by_id) == {"eth0", "lo"}
    for r in resources:
        check_cosi_metadata(r, ns, ty)
    eth0 = load_yaml(by_id["eth0"].spec.yaml_spec)
    assert eth0["type"] == "ether"
    assert MAC.match(eth0["hardwareAddr"]), eth0["hardwareAddr"]
    assert eth0["hardwareAddr"] != "00:00:00:00:00:00"
    assert eth0["operationalState"] == "up"
    assert eth0["linkState"] is True
    assert isinstance(eth0["index"], int) and isinstance(eth0["mtu"], int)
    lo = load_yaml(by_id["lo"].spec.yaml_spec)
    assert lo["type"] == "loopback"
    # Deterministic per machine: a second listing is identical.
    again = {r.metadata.id: r.spec.yaml_spec for r in cosi_list(ns, ty)}
    assert again == {k: v.spec.yaml_spec for k, v in by_id.items()}


def test_cosi_addresses():
    ns, ty = "network", "AddressStatuses.net.talos.dev"
    resources = cosi_list(ns, ty)
    for r in resources:
        check_cosi_metadata(r, ns, ty)
        spec = load_yaml(r.spec.yaml_spec)
        # id convention: <link>/<ip>/<prefix>, and the spec agrees with it
        assert r.metadata.id == f"{spec['linkName']}/{spec['address']}"
        ipaddress.ip_interface(spec["address"])
        assert spec["family"] in ("inet4", "inet6")
    specs = {r.metadata.id: load_yaml(r.spec.yaml_spec) for r in resources}
    eth0 = specs[f"eth0/{ADDRESS}/24"]
    assert eth0["address"] == f"{ADDRESS}/24"
    assert eth0["linkName"] == "eth0"
    assert eth0["scope"] == "global"
    assert "lo/127.0.0.1/8" in specs


def test_cosi_disks():
    ns, ty = "runtime", "Disks.block.talos.dev"
    resources = cosi_list(ns, ty)
    assert [r.metadata.id for r in resources] == ["sda"]
    check_cosi_metadata(resources[0], ns, ty)
    spec = load_yaml(resources[0].spec.yaml_spec)
    assert spec["dev_path"] == "/dev/sda"
    assert isinstance(spec["size"], int) and spec["size"] > 0
    assert spec["model"]
    assert spec["readonly"] is False and spec["cdrom"] is False


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def test_cosi_proto_spec_matches_yaml_spec():
    """Real Talos fills proto_spec AND yaml_spec; typed Go clients (COSI.List) decode
    proto_spec. Every resource's proto_spec decodes with the official messages (or, for
    block.DiskSpec, the declaration from the wire reference) to what its yaml_spec says."""
    links = {r.metadata.id: r for r in cosi_list("network", "LinkStatuses.net.talos.dev")}
    assert links["eth0"].spec.proto_spec, "Spec.proto_spec is empty"
    eth0_yaml = load_yaml(links["eth0"].spec.yaml_spec)
    eth0 = LinkStatusSpec().parse(links["eth0"].spec.proto_spec)
    assert_no_unknown_fields(eth0)
    assert eth0.type == NethelpersLinkType.LINK_ETHER
    assert eth0.hardware_addr == bytes.fromhex(eth0_yaml["hardwareAddr"].replace(":", ""))
    assert eth0.permanent_addr == bytes.fromhex(eth0_yaml["permanentAddr"].replace(":", ""))
    assert eth0.broadcast_addr == bytes.fromhex(eth0_yaml["broadcastAddr"].replace(":", ""))
    assert eth0.operational_state == NethelpersOperationalState.OPER_STATE_UP
    assert eth0.mtu == eth0_yaml["mtu"]
    assert eth0.index == eth0_yaml["index"]
    assert eth0.link_state is eth0_yaml["linkState"]
    assert eth0.speed_megabits == eth0_yaml["speedMbit"]
    assert eth0.driver == eth0_yaml["driver"]
    assert eth0.queue_disc == eth0_yaml["queueDisc"]
    # "UP,BROADCAST,RUNNING,MULTICAST,LOWER_UP" as the kernel's IFF_* bits.
    iff = {"UP": 0x1, "BROADCAST": 0x2, "LOOPBACK": 0x8, "RUNNING": 0x40,
           "MULTICAST": 0x1000, "LOWER_UP": 0x10000}
    assert eth0.flags == sum(iff[f] for f in eth0_yaml["flags"].split(","))
    lo_yaml = load_yaml(links["lo"].spec.yaml_spec)
    lo = LinkStatusSpec().parse(links["lo"].spec.proto_spec)
    assert_no_unknown_fields(lo)
    assert lo.type == NethelpersLinkType.LINK_LOOPBCK
    assert lo.flags == sum(iff[f] for f in lo_yaml["flags"].split(","))
    assert lo.mtu == lo_yaml["mtu"]

    addrs = cosi_list("network", "AddressStatuses.net.talos.dev")
    for r in addrs:
        assert r.spec.proto_spec, f"{r.metadata.id}: Spec.proto_spec is empty"
        yml = load_yaml(r.spec.yaml_spec)
        spec = AddressStatusSpec().parse(r.spec.proto_spec)
        # priority (field 11) postdates the v1.6 package: the only field it may not know,
        # and it must carry yaml_spec's value.
        assert spec._unknown_fields == b"\x58" + varint(yml["priority"]), spec._unknown_fields
        iface = ipaddress.ip_interface(yml["address"])
        assert spec.address.ip == iface.ip.packed
        assert spec.address.prefix_length == iface.network.prefixlen
        assert spec.local.ip == ipaddress.ip_address(yml["local"]).packed
        assert spec.link_name == yml["linkName"]
        assert spec.link_index == yml["linkIndex"]
        assert spec.family == NethelpersFamily.FAMILY_INET4
        assert spec.flags == 0x80  # IFA_F_PERMANENT: "permanent"
    eth0_addr = next(r for r in addrs if r.metadata.id == f"eth0/{ADDRESS}/24")
    spec = AddressStatusSpec().parse(eth0_addr.spec.proto_spec)
    assert spec.address.ip == ipaddress.ip_address(ADDRESS).packed
    assert spec.address.prefix_length == 24
    assert spec.link_name == "eth0"
    assert spec.scope == NethelpersScope.SCOPE_GLOBAL
    lo_addr = next(r for r in addrs if r.metadata.id == "lo/127.0.0.1/8")
    assert AddressStatusSpec().parse(lo_addr.spec.proto_spec).scope == NethelpersScope.SCOPE_HOST

    disk = cosi_list("runtime", "Disks.block.talos.dev")[0]
    dyaml = load_yaml(disk.spec.yaml_spec)
    dspec = cosi.DiskSpec().parse(disk.spec.proto_spec)
    assert_no_unknown_fields(dspec)
    assert dspec.dev_path == "/dev/sda" == dyaml["dev_path"]
    assert dspec.size == dyaml["size"]
    assert dspec.model == dyaml["model"]
    assert dspec.serial == dyaml["serial"]
    assert dspec.io_size == dyaml["io_size"] and dspec.sector_size == dyaml["sector_size"]
    assert dspec.pretty_size == dyaml["pretty_size"]
    assert dspec.symlinks == dyaml["symlinks"]
    assert dspec.readonly is dyaml["readonly"] and dspec.rotational is dyaml["rotational"]


def test_storage_disks():
    resp = run(call(maintenance_tls(), lambda ch: StorageServiceStub(ch).disks(
        Empty(), timeout=RPC_TIMEOUT)))
    assert_no_unknown_fields(resp)
    assert len(resp.messages) == 1
    (disk,) = resp.messages[0].disks
    assert disk.device_name == "/dev/sda"
    assert disk.size > 0
    assert disk.model
    assert disk.type in (DiskDiskType.SSD, DiskDiskType.HDD, DiskDiskType.NVME)


def test_maintenance_refuses_admin_rpcs():
    with pytest.raises(GRPCError) as err:
        run(call(maintenance_tls(), lambda ch: MachineServiceStub(ch).bootstrap(
            BootstrapRequest(), timeout=RPC_TIMEOUT)))
    assert err.value.status == Status.PERMISSION_DENIED


def test_maintenance_refuses_reboot_and_upgrade():
    # Talos v1.13 serves maintenance mode with the regular API: every caller is os:reader,
    # so the authorizer refuses Reboot (admin, operator) and Upgrade (admin).
    for rpc in (
        lambda ch: MachineServiceStub(ch).reboot(RebootRequest(), timeout=RPC_TIMEOUT),
        lambda ch: MachineServiceStub(ch).upgrade(
            UpgradeRequest(image=f"ghcr.io/siderolabs/installer:{UPGRADE_TAG}"),
            timeout=RPC_TIMEOUT),
    ):
        with pytest.raises(GRPCError) as err:
            run(call(maintenance_tls(), rpc))
        assert err.value.status == Status.PERMISSION_DENIED


def test_apply_configuration_rejects_garbage():
    with pytest.raises(GRPCError) as err:
        run(call(maintenance_tls(), lambda ch: MachineServiceStub(ch).apply_configuration(
            ApplyConfigurationRequest(data=b"this: is: not a machine config",
                                      mode=ApplyConfigurationRequestMode.AUTO),
            timeout=RPC_TIMEOUT)))
    assert err.value.status == Status.INVALID_ARGUMENT


def test_apply_configuration_rejects_unknown_keys(generated):
    """Talos' config loader is strict: a misspelled key (as our generator could write it) is
    refused before anything is applied."""
    misspelled = generated["config"].replace(
        b"allowSchedulingOnControlPlanes: true", b"allowSchedulingOnControlPlane: true")
    assert misspelled != generated["config"]
    with pytest.raises(GRPCError) as err:
        run(call(maintenance_tls(), lambda ch: MachineServiceStub(ch).apply_configuration(
            ApplyConfigurationRequest(data=misspelled, mode=ApplyConfigurationRequestMode.AUTO),
            timeout=RPC_TIMEOUT)))
    assert err.value.status == Status.INVALID_ARGUMENT
    assert "unknown keys found during decoding" in err.value.message
    assert "allowSchedulingOnControlPlane" in err.value.message
    # Still in maintenance mode: the next test applies the config spelled right.
    run(call(maintenance_tls(), lambda ch: MachineServiceStub(ch).version(
        Empty(), timeout=RPC_TIMEOUT)))


def test_apply_configuration(generated):
    # talosctl apply-config --insecure sends mode AUTO.
    resp = run(call(maintenance_tls(), lambda ch: MachineServiceStub(ch).apply_configuration(
        ApplyConfigurationRequest(data=generated["config"],
                                  mode=ApplyConfigurationRequestMode.AUTO),
        timeout=RPC_TIMEOUT)))
    assert_no_unknown_fields(resp)
    assert len(resp.messages) == 1
    msg = resp.messages[0]
    assert not on_wire(msg.metadata)
    # v1.13 maintenance mode resolves AUTO (and REBOOT) to NO_REBOOT.
    assert msg.mode == ApplyConfigurationRequestMode.NO_REBOOT
    assert msg.mode_details == "Applied configuration without a reboot"
    assert msg.warnings == []


# ---------------------------------------------------------------------------------------
# configured mode


def test_configured_refuses_connection_without_client_cert(generated):
    deadline = time.monotonic() + 30
    while True:
        try:
            run(call(maintenance_tls(), lambda ch: MachineServiceStub(ch).version(
                Empty(), timeout=5)))
        except (GRPCError, StreamTerminatedError, ProtocolError, OSError, asyncio.TimeoutError):
            return  # refused: the handshake (or the call) fails without a client cert
        assert time.monotonic() < deadline, "configured machine still answers without mTLS"
        time.sleep(0.5)


def test_configured_version(generated):
    resp = run(call(configured_tls(generated), lambda ch: MachineServiceStub(ch).version(
        Empty(), timeout=RPC_TIMEOUT)))
    assert_no_unknown_fields(resp)
    msg = resp.messages[0]
    assert msg.version.tag == TALOS_TAG
    assert on_wire(msg.features) and msg.features.rbac is True


def test_bootstrap(generated):
    resp = run(call(configured_tls(generated), lambda ch: MachineServiceStub(ch).bootstrap(
        BootstrapRequest(), timeout=120)))
    assert_no_unknown_fields(resp)
    assert len(resp.messages) == 1
    assert not on_wire(resp.messages[0].metadata)
    # A second bootstrap: etcd data directory is not empty.
    with pytest.raises(GRPCError) as err:
        run(call(configured_tls(generated), lambda ch: MachineServiceStub(ch).bootstrap(
            BootstrapRequest(), timeout=RPC_TIMEOUT)))
    assert err.value.status == Status.ALREADY_EXISTS


def test_kubeconfig(generated, workdir):
    chunks = run(call(configured_tls(generated), lambda ch: collect(
        MachineServiceStub(ch).kubeconfig(Empty(), timeout=RPC_TIMEOUT))))
    assert chunks, "at least one common.Data"
    for chunk in chunks:
        assert_no_unknown_fields(chunk)
        assert not chunk.metadata.error if on_wire(chunk.metadata) else True
    archive = b"".join(c.bytes for c in chunks)
    assert archive[:2] == b"\x1f\x8b", "gzip"
    # Read the first entry and stop, as talosctl does (Talos never closes its tar writer).
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(archive)), mode="r|") as tar:
        entry = tar.next()
        assert entry is not None and entry.name == "kubeconfig" and entry.isfile()
        assert entry.mode & 0o777 == 0o600
        text = tar.extractfile(entry).read().decode()
    kubeconfig = load_yaml(text)
    assert kubeconfig["apiVersion"] == "v1" and kubeconfig["kind"] == "Config"
    user = f"admin@{CLUSTER}"
    assert kubeconfig["current-context"] == user
    (cluster,) = kubeconfig["clusters"]
    assert cluster["name"] == CLUSTER
    assert cluster["cluster"]["server"] == f"https://{ADDRESS}:{API_PORT}"
    (context,) = kubeconfig["contexts"]
    assert context["name"] == user
    assert context["context"]["cluster"] == CLUSTER
    assert context["context"]["user"] == user
    (u,) = kubeconfig["users"]
    assert u["name"] == user

    # The kubeconfig works: the API server on the machine's address becomes ready.
    creds = workdir / "kube"
    creds.mkdir()
    (creds / "ca.crt").write_bytes(base64.b64decode(cluster["cluster"]["certificate-authority-data"]))
    (creds / "tls.crt").write_bytes(base64.b64decode(u["user"]["client-certificate-data"]))
    (creds / "tls.key").write_bytes(base64.b64decode(u["user"]["client-key-data"]))
    ctx = ssl.create_default_context(cafile=str(creds / "ca.crt"))
    ctx.load_cert_chain(str(creds / "tls.crt"), str(creds / "tls.key"))
    deadline = time.monotonic() + 120
    last = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"https://{ADDRESS}:{API_PORT}/readyz",
                                        context=ctx, timeout=10) as r:
                if r.status == 200 and r.read().strip() == b"ok":
                    return
        except OSError as e:  # URLError and HTTPError are OSErrors
            last = e
        time.sleep(1)
    pytest.fail(f"API server not ready with the kubeconfig: {last}")


def api_ready(workdir) -> bool:
    """The API server answers /readyz with the kubeconfig's credentials (test_kubeconfig)."""
    creds = workdir / "kube"
    ctx = ssl.create_default_context(cafile=str(creds / "ca.crt"))
    ctx.load_cert_chain(str(creds / "tls.crt"), str(creds / "tls.key"))
    try:
        with urllib.request.urlopen(f"https://{ADDRESS}:{API_PORT}/readyz",
                                    context=ctx, timeout=10) as r:
            return r.status == 200 and r.read().strip() == b"ok"
    except OSError:
        return False


def away_then_back(generated, since: float) -> tuple[float, str]:
    """Waits until the Talos port refuses connections, then until Version answers over mTLS
    again; returns the seconds from ``since`` until then and the version tag."""
    deadline = since + REBOOT_DOWNTIME / 2
    while True:
        try:
            socket.create_connection((ADDRESS, TALOS_PORT), timeout=1).close()
        except OSError:
            break
        assert time.monotonic() < deadline, "the machine never went away"
        time.sleep(0.02)
    deadline = since + REBOOT_DOWNTIME + 30
    while True:
        try:
            resp = run(call(configured_tls(generated), lambda ch: MachineServiceStub(ch).version(
                Empty(), timeout=5)))
            return time.monotonic() - since, resp.messages[0].version.tag
        except (GRPCError, StreamTerminatedError, ProtocolError, OSError, asyncio.TimeoutError):
            pass
        assert time.monotonic() < deadline, "the machine did not come back"
        time.sleep(0.05)


def test_reboot(generated, workdir):
    resp = run(call(configured_tls(generated), lambda ch: MachineServiceStub(ch).reboot(
        RebootRequest(mode=RebootRequestMode.POWERCYCLE), timeout=RPC_TIMEOUT)))
    since = time.monotonic()
    assert_no_unknown_fields(resp)
    (msg,) = resp.messages
    assert not on_wire(msg.metadata)
    assert msg.actor_id
    away, tag = away_then_back(generated, since)
    assert away >= REBOOT_DOWNTIME * 0.9, away
    assert tag == TALOS_TAG
    # Back configured, with its cluster.
    assert api_ready(workdir)


def test_upgrade_rejects_a_malformed_image(generated):
    for image in ("ghcr.io/siderolabs/Installer:v1.13.9", "installer:v1:2", ""):
        with pytest.raises(GRPCError) as err:
            run(call(configured_tls(generated), lambda ch: MachineServiceStub(ch).upgrade(
                UpgradeRequest(image=image), timeout=RPC_TIMEOUT)))
        assert err.value.status == Status.INVALID_ARGUMENT, image


def test_upgrade(generated, workdir):
    resp = run(call(configured_tls(generated), lambda ch: MachineServiceStub(ch).upgrade(
        UpgradeRequest(image=f"ghcr.io/siderolabs/installer:{UPGRADE_TAG}",
                       reboot_mode=UpgradeRequestRebootMode.DEFAULT),
        timeout=RPC_TIMEOUT)))
    since = time.monotonic()
    assert_no_unknown_fields(resp)
    (msg,) = resp.messages
    assert not on_wire(msg.metadata)
    assert msg.ack == "Upgrade request received"
    assert msg.actor_id
    away, tag = away_then_back(generated, since)
    assert away >= REBOOT_DOWNTIME * 0.9, away
    assert tag == UPGRADE_TAG
    assert api_ready(workdir)
