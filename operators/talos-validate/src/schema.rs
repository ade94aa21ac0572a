//! The allow-lists: every key the validator accepts, per section and per document kind, with
//! the Go type Talos decodes it into. A key missing here is refused as Talos refuses it
//! ("unknown keys found during decoding"); a value of the wrong shape is refused as `yaml.v3`
//! refuses it ("cannot unmarshal !!str into bool").
//!
//! Sources: Talos' `pkg/machinery/config/types/v1alpha1/v1alpha1_types.go` (the `yaml` tags)
//! and the typed documents' own files (`types/network`, `types/cri`, `types/runtime`,
//! `types/security`, `types/runtime/extensions`), read for the v1.12 and v1.13 lines.
//! Deprecated but still accepted keys are listed (Talos still decodes them).

/// The type Talos decodes a value into.
#[derive(Debug)]
pub(crate) enum Ty {
    /// Go `string`: any scalar.
    Str,
    /// Go `bool` (`yaml.v3` also takes YAML 1.1 `yes`/`no`/`on`/`off`).
    Bool,
    /// A Go integer of the given name (`int`, `uint32`, ...) and range.
    Int {
        go: &'static str,
        min: i128,
        max: i128,
    },
    /// Go `time.Duration`: a string in Go's duration syntax (`1h30m`), never a bare number.
    Duration,
    /// `v1alpha1.FileMode`: an integer (octal `0o644` or `0644` welcome).
    FileMode,
    /// A base64 (standard, padded) string: the `crt`/`key` of Talos' PEM-encoded types.
    Base64,
    /// `v1alpha1.DiskSize`: bytes as an integer or a human size (`100MB`, `1 GiB`).
    ByteSize,
    /// `v1alpha1.InstallDiskSizeMatcher`: `[>=|<=|>|<|==]<size>`.
    SizeMatcher,
    /// Go `map[string]T`.
    Map(&'static Ty, &'static str),
    /// Go `[]T`.
    List(&'static Ty, &'static str),
    /// A Go struct: only its fields are allowed.
    Struct(&'static Struct),
    /// `v1alpha1.Unstructured` (an embedded Kubernetes object): any mapping.
    Object,
}

/// A Go struct: its type name (for messages) and its YAML keys.
#[derive(Debug)]
pub(crate) struct Struct {
    pub go: &'static str,
    pub fields: &'static [Field],
}

/// One allowed key.
#[derive(Debug)]
pub(crate) struct Field {
    pub key: &'static str,
    pub ty: &'static Ty,
}

impl Ty {
    /// The Go type name used in `yaml.v3` messages.
    pub fn go_name(&self) -> &'static str {
        match self {
            Self::Str => "string",
            Self::Bool => "bool",
            Self::Duration => "time.Duration",
            Self::FileMode => "v1alpha1.FileMode",
            Self::Base64 => "[]uint8",
            Self::ByteSize => "v1alpha1.DiskSize",
            Self::SizeMatcher => "v1alpha1.InstallDiskSizeMatcher",
            Self::Int { go, .. } | Self::Map(_, go) | Self::List(_, go) => go,
            Self::Struct(s) => s.go,
            Self::Object => "map[string]interface {}",
        }
    }
}

impl Struct {
    pub fn field(&self, key: &str) -> Option<&'static Ty> {
        self.fields.iter().find(|f| f.key == key).map(|f| f.ty)
    }
}

macro_rules! structure {
    ($name:ident, $ty:ident, $go:literal, { $($key:literal => $fty:expr),* $(,)? }) => {
        pub(crate) static $name: Struct = Struct {
            go: $go,
            fields: &[$(Field { key: $key, ty: $fty }),*],
        };
        pub(crate) static $ty: Ty = Ty::Struct(&$name);
    };
}

macro_rules! list {
    ($name:ident, $elem:expr, $go:literal) => {
        pub(crate) static $name: Ty = Ty::List($elem, $go);
    };
}

// ------------------------------------------------------------------------------ scalars

pub(crate) static STR: Ty = Ty::Str;
pub(crate) static BOOL: Ty = Ty::Bool;
pub(crate) static INT: Ty = Ty::Int {
    go: "int",
    min: i64::MIN as i128,
    max: i64::MAX as i128,
};
pub(crate) static UINT: Ty = Ty::Int {
    go: "uint",
    min: 0,
    max: u64::MAX as i128,
};
pub(crate) static U8: Ty = Ty::Int {
    go: "uint8",
    min: 0,
    max: u8::MAX as i128,
};
pub(crate) static U16: Ty = Ty::Int {
    go: "uint16",
    min: 0,
    max: u16::MAX as i128,
};
pub(crate) static U32: Ty = Ty::Int {
    go: "uint32",
    min: 0,
    max: u32::MAX as i128,
};
pub(crate) static U64: Ty = Ty::Int {
    go: "uint64",
    min: 0,
    max: u64::MAX as i128,
};
pub(crate) static DURATION: Ty = Ty::Duration;
pub(crate) static FILE_MODE: Ty = Ty::FileMode;
pub(crate) static BASE64: Ty = Ty::Base64;
pub(crate) static BYTE_SIZE: Ty = Ty::ByteSize;
pub(crate) static SIZE_MATCHER: Ty = Ty::SizeMatcher;
pub(crate) static OBJECT: Ty = Ty::Object;
pub(crate) static STRS: Ty = Ty::List(&STR, "[]string");
pub(crate) static STR_MAP: Ty = Ty::Map(&STR, "map[string]string");
list!(OBJECTS, &OBJECT, "[]v1alpha1.Unstructured");

// ------------------------------------------------------------------------------ shared

structure!(CERT_AND_KEY, CERT_AND_KEY_TY, "x509.PEMEncodedCertificateAndKey", {
    "crt" => &BASE64,
    "key" => &BASE64,
});
structure!(CERT, CERT_TY, "x509.PEMEncodedCertificate", { "crt" => &BASE64 });
list!(CERTS, &CERT_TY, "[]*x509.PEMEncodedCertificate");
structure!(KEY, KEY_TY, "x509.PEMEncodedKey", { "key" => &BASE64 });

// ------------------------------------------------------------------------------ v1alpha1

structure!(CONFIG, CONFIG_TY, "v1alpha1.Config", {
    "version" => &STR,
    "debug" => &BOOL,
    "persist" => &BOOL,
    "machine" => &MACHINE_TY,
    "cluster" => &CLUSTER_TY,
});

structure!(MACHINE, MACHINE_TY, "v1alpha1.MachineConfig", {
    "type" => &STR,
    "token" => &STR,
    "ca" => &CERT_AND_KEY_TY,
    "acceptedCAs" => &CERTS,
    "certSANs" => &STRS,
    "controlPlane" => &MACHINE_CONTROL_PLANE_TY,
    "kubelet" => &KUBELET_TY,
    "pods" => &OBJECTS,
    "network" => &NETWORK_TY,
    "disks" => &MACHINE_DISKS,
    "install" => &INSTALL_TY,
    "files" => &FILES,
    "env" => &STR_MAP,
    "time" => &TIME_TY,
    "sysctls" => &STR_MAP,
    "sysfs" => &STR_MAP,
    "registries" => &REGISTRIES_TY,
    "systemDiskEncryption" => &DISK_ENCRYPTION_TY,
    "features" => &FEATURES_TY,
    "udev" => &UDEV_TY,
    "logging" => &LOGGING_TY,
    "kernel" => &KERNEL_TY,
    "seccompProfiles" => &SECCOMP_PROFILES,
    "baseRuntimeSpecOverrides" => &OBJECT,
    "nodeLabels" => &STR_MAP,
    "nodeAnnotations" => &STR_MAP,
    "nodeTaints" => &STR_MAP,
});

structure!(DISABLED, DISABLED_TY, "v1alpha1.MachineControllerManagerConfig", {
    "disabled" => &BOOL,
});
structure!(MACHINE_CONTROL_PLANE, MACHINE_CONTROL_PLANE_TY, "v1alpha1.MachineControlPlaneConfig", {
    "controllerManager" => &DISABLED_TY,
    "scheduler" => &DISABLED_TY,
});

structure!(KUBELET, KUBELET_TY, "v1alpha1.KubeletConfig", {
    "image" => &STR,
    "clusterDNS" => &STRS,
    "extraArgs" => &STR_MAP,
    "extraMounts" => &EXTRA_MOUNTS,
    "extraConfig" => &OBJECT,
    "credentialProviderConfig" => &OBJECT,
    "defaultRuntimeSeccompProfileEnabled" => &BOOL,
    "registerWithFQDN" => &BOOL,
    "nodeIP" => &KUBELET_NODE_IP_TY,
    "skipNodeRegistration" => &BOOL,
    "disableManifestsDirectory" => &BOOL,
});
structure!(KUBELET_NODE_IP, KUBELET_NODE_IP_TY, "v1alpha1.KubeletNodeIPConfig", {
    "validSubnets" => &STRS,
});
structure!(ID_MAPPING, ID_MAPPING_TY, "v1alpha1.LinuxIDMapping", {
    "containerID" => &U32,
    "hostID" => &U32,
    "size" => &U32,
});
list!(ID_MAPPINGS, &ID_MAPPING_TY, "[]v1alpha1.LinuxIDMapping");
structure!(EXTRA_MOUNT, EXTRA_MOUNT_TY, "v1alpha1.ExtraMount", {
    "destination" => &STR,
    "type" => &STR,
    "source" => &STR,
    "options" => &STRS,
    "uidMappings" => &ID_MAPPINGS,
    "gidMappings" => &ID_MAPPINGS,
});
list!(EXTRA_MOUNTS, &EXTRA_MOUNT_TY, "[]v1alpha1.ExtraMount");

structure!(NETWORK, NETWORK_TY, "v1alpha1.NetworkConfig", {
    "hostname" => &STR,
    "interfaces" => &DEVICES,
    "nameservers" => &STRS,
    "searchDomains" => &STRS,
    "extraHostEntries" => &EXTRA_HOSTS,
    "kubespan" => &KUBESPAN_TY,
    "disableSearchDomain" => &BOOL,
});
structure!(EXTRA_HOST, EXTRA_HOST_TY, "v1alpha1.ExtraHost", {
    "ip" => &STR,
    "aliases" => &STRS,
});
list!(EXTRA_HOSTS, &EXTRA_HOST_TY, "[]*v1alpha1.ExtraHost");
structure!(DEVICE, DEVICE_TY, "v1alpha1.Device", {
    "interface" => &STR,
    "deviceSelector" => &DEVICE_SELECTOR_TY,
    "addresses" => &STRS,
    "cidr" => &STR,
    "routes" => &ROUTES,
    "bond" => &BOND_TY,
    "bridge" => &BRIDGE_TY,
    "bridgePort" => &BRIDGE_PORT_TY,
    "vlans" => &VLANS,
    "mtu" => &INT,
    "dhcp" => &BOOL,
    "ignore" => &BOOL,
    "dummy" => &BOOL,
    "dhcpOptions" => &DHCP_OPTIONS_TY,
    "wireguard" => &WIREGUARD_TY,
    "vip" => &VIP_TY,
});
list!(DEVICES, &DEVICE_TY, "v1alpha1.NetworkDeviceList");
structure!(DEVICE_SELECTOR, DEVICE_SELECTOR_TY, "v1alpha1.NetworkDeviceSelector", {
    "busPath" => &STR,
    "hardwareAddr" => &STR,
    "permanentAddr" => &STR,
    "pciID" => &STR,
    "driver" => &STR,
    "physical" => &BOOL,
});
list!(
    DEVICE_SELECTORS,
    &DEVICE_SELECTOR_TY,
    "[]v1alpha1.NetworkDeviceSelector"
);
structure!(ROUTE, ROUTE_TY, "v1alpha1.Route", {
    "network" => &STR,
    "gateway" => &STR,
    "source" => &STR,
    "metric" => &U32,
    "mtu" => &U32,
});
list!(ROUTES, &ROUTE_TY, "[]*v1alpha1.Route");
structure!(BOND, BOND_TY, "v1alpha1.Bond", {
    "interfaces" => &STRS,
    "deviceSelectors" => &DEVICE_SELECTORS,
    "arpIPTarget" => &STRS,
    "mode" => &STR,
    "xmitHashPolicy" => &STR,
    "lacpRate" => &STR,
    "adActorSystem" => &STR,
    "arpValidate" => &STR,
    "arpAllTargets" => &STR,
    "primary" => &STR,
    "primaryReselect" => &STR,
    "failOverMac" => &STR,
    "adSelect" => &STR,
    "miimon" => &U32,
    "updelay" => &U32,
    "downdelay" => &U32,
    "arpInterval" => &U32,
    "resendIgmp" => &U32,
    "minLinks" => &U32,
    "lpInterval" => &U32,
    "packetsPerSlave" => &U32,
    "numPeerNotif" => &U8,
    "tlbDynamicLb" => &U8,
    "allSlavesActive" => &U8,
    "useCarrier" => &BOOL,
    "adActorSysPrio" => &U16,
    "adUserPortKey" => &U16,
    "peerNotifyDelay" => &U32,
});
structure!(STP, STP_TY, "v1alpha1.STP", { "enabled" => &BOOL });
structure!(BRIDGE_VLAN, BRIDGE_VLAN_TY, "v1alpha1.BridgeVLAN", { "vlanFiltering" => &BOOL });
structure!(BRIDGE, BRIDGE_TY, "v1alpha1.Bridge", {
    "interfaces" => &STRS,
    "stp" => &STP_TY,
    "vlan" => &BRIDGE_VLAN_TY,
});
structure!(BRIDGE_PORT, BRIDGE_PORT_TY, "v1alpha1.BridgePort", { "master" => &STR });
structure!(VLAN, VLAN_TY, "v1alpha1.Vlan", {
    "addresses" => &STRS,
    "cidr" => &STR,
    "routes" => &ROUTES,
    "dhcp" => &BOOL,
    "vlanId" => &U16,
    "mtu" => &U32,
    "vip" => &VIP_TY,
    "dhcpOptions" => &DHCP_OPTIONS_TY,
});
list!(VLANS, &VLAN_TY, "v1alpha1.VlanList");
structure!(DHCP_OPTIONS, DHCP_OPTIONS_TY, "v1alpha1.DHCPOptions", {
    "routeMetric" => &U32,
    "ipv4" => &BOOL,
    "ipv6" => &BOOL,
    "duidv6" => &STR,
});
structure!(WIREGUARD, WIREGUARD_TY, "v1alpha1.DeviceWireguardConfig", {
    "privateKey" => &STR,
    "listenPort" => &INT,
    "firewallMark" => &INT,
    "peers" => &WIREGUARD_PEERS,
});
structure!(WIREGUARD_PEER, WIREGUARD_PEER_TY, "v1alpha1.DeviceWireguardPeer", {
    "publicKey" => &STR,
    "endpoint" => &STR,
    "persistentKeepaliveInterval" => &DURATION,
    "allowedIPs" => &STRS,
});
list!(
    WIREGUARD_PEERS,
    &WIREGUARD_PEER_TY,
    "[]*v1alpha1.DeviceWireguardPeer"
);
structure!(API_TOKEN, API_TOKEN_TY, "v1alpha1.VIPEquinixMetalConfig", { "apiToken" => &STR });
structure!(VIP, VIP_TY, "v1alpha1.DeviceVIPConfig", {
    "ip" => &STR,
    "equinixMetal" => &API_TOKEN_TY,
    "hcloud" => &API_TOKEN_TY,
});
structure!(KUBESPAN_FILTERS, KUBESPAN_FILTERS_TY, "v1alpha1.KubeSpanFilters", {
    "endpoints" => &STRS,
    "excludeAdvertisedNetworks" => &STRS,
});
structure!(KUBESPAN, KUBESPAN_TY, "v1alpha1.NetworkKubeSpan", {
    "enabled" => &BOOL,
    "advertiseKubernetesNetworks" => &BOOL,
    "allowDownPeerBypass" => &BOOL,
    "harvestExtraEndpoints" => &BOOL,
    "mtu" => &U32,
    "filters" => &KUBESPAN_FILTERS_TY,
});

structure!(PARTITION, PARTITION_TY, "v1alpha1.DiskPartition", {
    "size" => &BYTE_SIZE,
    "mountpoint" => &STR,
});
list!(PARTITIONS, &PARTITION_TY, "[]*v1alpha1.DiskPartition");
structure!(MACHINE_DISK, MACHINE_DISK_TY, "v1alpha1.MachineDisk", {
    "device" => &STR,
    "partitions" => &PARTITIONS,
});
list!(MACHINE_DISKS, &MACHINE_DISK_TY, "[]*v1alpha1.MachineDisk");

structure!(INSTALL, INSTALL_TY, "v1alpha1.InstallConfig", {
    "disk" => &STR,
    "diskSelector" => &DISK_SELECTOR_TY,
    "extraKernelArgs" => &STRS,
    "image" => &STR,
    "extensions" => &INSTALL_EXTENSIONS,
    "bootloader" => &BOOL,
    "wipe" => &BOOL,
    "legacyBIOSSupport" => &BOOL,
    "grubUseUKICmdline" => &BOOL,
});
structure!(DISK_SELECTOR, DISK_SELECTOR_TY, "v1alpha1.InstallDiskSelector", {
    "size" => &SIZE_MATCHER,
    "name" => &STR,
    "model" => &STR,
    "serial" => &STR,
    "modalias" => &STR,
    "uuid" => &STR,
    "wwid" => &STR,
    "type" => &STR,
    "busPath" => &STR,
});
structure!(INSTALL_EXTENSION, INSTALL_EXTENSION_TY, "v1alpha1.InstallExtensionConfig", {
    "image" => &STR,
});
list!(
    INSTALL_EXTENSIONS,
    &INSTALL_EXTENSION_TY,
    "[]v1alpha1.InstallExtensionConfig"
);

structure!(FILE, FILE_TY, "v1alpha1.MachineFile", {
    "content" => &STR,
    "permissions" => &FILE_MODE,
    "path" => &STR,
    "op" => &STR,
});
list!(FILES, &FILE_TY, "[]*v1alpha1.MachineFile");
structure!(TIME, TIME_TY, "v1alpha1.TimeConfig", {
    "disabled" => &BOOL,
    "servers" => &STRS,
    "bootTimeout" => &DURATION,
});

structure!(MIRROR, MIRROR_TY, "v1alpha1.RegistryMirrorConfig", {
    "endpoints" => &STRS,
    "overridePath" => &BOOL,
    "skipFallback" => &BOOL,
});
pub(crate) static MIRRORS: Ty = Ty::Map(&MIRROR_TY, "map[string]*v1alpha1.RegistryMirrorConfig");
structure!(REGISTRY_TLS, REGISTRY_TLS_TY, "v1alpha1.RegistryTLSConfig", {
    "clientIdentity" => &CERT_AND_KEY_TY,
    "ca" => &BASE64,
    "insecureSkipVerify" => &BOOL,
});
structure!(REGISTRY_AUTH, REGISTRY_AUTH_TY, "v1alpha1.RegistryAuthConfig", {
    "username" => &STR,
    "password" => &STR,
    "auth" => &STR,
    "identityToken" => &STR,
});
structure!(REGISTRY_CONFIG, REGISTRY_CONFIG_TY, "v1alpha1.RegistryConfig", {
    "tls" => &REGISTRY_TLS_TY,
    "auth" => &REGISTRY_AUTH_TY,
});
pub(crate) static REGISTRY_CONFIGS: Ty =
    Ty::Map(&REGISTRY_CONFIG_TY, "map[string]*v1alpha1.RegistryConfig");
structure!(REGISTRIES, REGISTRIES_TY, "v1alpha1.RegistriesConfig", {
    "mirrors" => &MIRRORS,
    "config" => &REGISTRY_CONFIGS,
});

structure!(KEY_STATIC, KEY_STATIC_TY, "v1alpha1.EncryptionKeyStatic", { "passphrase" => &STR });
structure!(
    KEY_NODE_ID,
    KEY_NODE_ID_TY,
    "v1alpha1.EncryptionKeyNodeID",
    {}
);
structure!(KEY_KMS, KEY_KMS_TY, "v1alpha1.EncryptionKeyKMS", { "endpoint" => &STR });
structure!(KEY_TPM, KEY_TPM_TY, "v1alpha1.EncryptionKeyTPM", {
    "checkSecurebootStatusOnEnroll" => &BOOL,
});
structure!(ENCRYPTION_KEY, ENCRYPTION_KEY_TY, "v1alpha1.EncryptionKey", {
    "static" => &KEY_STATIC_TY,
    "nodeID" => &KEY_NODE_ID_TY,
    "kms" => &KEY_KMS_TY,
    "slot" => &INT,
    "tpm" => &KEY_TPM_TY,
});
list!(
    ENCRYPTION_KEYS,
    &ENCRYPTION_KEY_TY,
    "[]*v1alpha1.EncryptionKey"
);
structure!(ENCRYPTION, ENCRYPTION_TY, "v1alpha1.EncryptionConfig", {
    "provider" => &STR,
    "keys" => &ENCRYPTION_KEYS,
    "cipher" => &STR,
    "keySize" => &UINT,
    "blockSize" => &U64,
    "options" => &STRS,
});
structure!(DISK_ENCRYPTION, DISK_ENCRYPTION_TY, "v1alpha1.SystemDiskEncryptionConfig", {
    "state" => &ENCRYPTION_TY,
    "ephemeral" => &ENCRYPTION_TY,
});

structure!(TALOS_API_ACCESS, TALOS_API_ACCESS_TY, "v1alpha1.KubernetesTalosAPIAccessConfig", {
    "enabled" => &BOOL,
    "allowedRoles" => &STRS,
    "allowedKubernetesNamespaces" => &STRS,
});
structure!(KUBE_PRISM, KUBE_PRISM_TY, "v1alpha1.KubePrism", {
    "enabled" => &BOOL,
    "port" => &INT,
});
structure!(HOST_DNS, HOST_DNS_TY, "v1alpha1.HostDNSConfig", {
    "enabled" => &BOOL,
    "forwardKubeDNSToHost" => &BOOL,
    "resolveMemberNames" => &BOOL,
});
structure!(IMAGE_CACHE, IMAGE_CACHE_TY, "v1alpha1.ImageCacheConfig", { "localEnabled" => &BOOL });
structure!(FEATURES, FEATURES_TY, "v1alpha1.FeaturesConfig", {
    "rbac" => &BOOL,
    "stableHostname" => &BOOL,
    "kubernetesTalosAPIAccess" => &TALOS_API_ACCESS_TY,
    "apidCheckExtKeyUsage" => &BOOL,
    "diskQuotaSupport" => &BOOL,
    "kubePrism" => &KUBE_PRISM_TY,
    "hostDNS" => &HOST_DNS_TY,
    "imageCache" => &IMAGE_CACHE_TY,
    "nodeAddressSortAlgorithm" => &STR,
});
structure!(UDEV, UDEV_TY, "v1alpha1.UdevConfig", { "rules" => &STRS });
structure!(LOGGING_DESTINATION, LOGGING_DESTINATION_TY, "v1alpha1.LoggingDestination", {
    "endpoint" => &STR,
    "format" => &STR,
    "extraTags" => &STR_MAP,
});
list!(
    LOGGING_DESTINATIONS,
    &LOGGING_DESTINATION_TY,
    "[]v1alpha1.LoggingDestination"
);
structure!(LOGGING, LOGGING_TY, "v1alpha1.LoggingConfig", {
    "destinations" => &LOGGING_DESTINATIONS,
});
structure!(KERNEL_MODULE, KERNEL_MODULE_TY, "v1alpha1.KernelModuleConfig", {
    "name" => &STR,
    "parameters" => &STRS,
});
list!(
    KERNEL_MODULES,
    &KERNEL_MODULE_TY,
    "[]*v1alpha1.KernelModuleConfig"
);
structure!(KERNEL, KERNEL_TY, "v1alpha1.KernelConfig", { "modules" => &KERNEL_MODULES });
structure!(SECCOMP_PROFILE, SECCOMP_PROFILE_TY, "v1alpha1.MachineSeccompProfile", {
    "name" => &STR,
    "value" => &OBJECT,
});
list!(
    SECCOMP_PROFILES,
    &SECCOMP_PROFILE_TY,
    "[]*v1alpha1.MachineSeccompProfile"
);

structure!(CLUSTER, CLUSTER_TY, "v1alpha1.ClusterConfig", {
    "id" => &STR,
    "secret" => &STR,
    "controlPlane" => &CONTROL_PLANE_TY,
    "clusterName" => &STR,
    "network" => &CLUSTER_NETWORK_TY,
    "token" => &STR,
    "aescbcEncryptionSecret" => &STR,
    "secretboxEncryptionSecret" => &STR,
    "ca" => &CERT_AND_KEY_TY,
    "acceptedCAs" => &CERTS,
    "aggregatorCA" => &CERT_AND_KEY_TY,
    "serviceAccount" => &KEY_TY,
    "apiServer" => &API_SERVER_TY,
    "controllerManager" => &CONTROLLER_MANAGER_TY,
    "proxy" => &PROXY_TY,
    "scheduler" => &SCHEDULER_TY,
    "discovery" => &DISCOVERY_TY,
    "etcd" => &ETCD_TY,
    "coreDNS" => &CORE_DNS_TY,
    "externalCloudProvider" => &EXTERNAL_CLOUD_PROVIDER_TY,
    "extraManifests" => &STRS,
    "extraManifestHeaders" => &STR_MAP,
    "inlineManifests" => &INLINE_MANIFESTS,
    "adminKubeconfig" => &ADMIN_KUBECONFIG_TY,
    "allowSchedulingOnMasters" => &BOOL,
    "allowSchedulingOnControlPlanes" => &BOOL,
});
structure!(CONTROL_PLANE, CONTROL_PLANE_TY, "v1alpha1.ControlPlaneConfig", {
    "endpoint" => &STR,
    "localAPIServerPort" => &INT,
});
structure!(FLANNEL, FLANNEL_TY, "v1alpha1.FlannelCNIConfig", {
    "extraArgs" => &STRS,
    "kubeNetworkPoliciesEnabled" => &BOOL,
});
structure!(CNI, CNI_TY, "v1alpha1.CNIConfig", {
    "name" => &STR,
    "urls" => &STRS,
    "flannel" => &FLANNEL_TY,
});
structure!(CLUSTER_NETWORK, CLUSTER_NETWORK_TY, "v1alpha1.ClusterNetworkConfig", {
    "cni" => &CNI_TY,
    "dnsDomain" => &STR,
    "podSubnets" => &STRS,
    "serviceSubnets" => &STRS,
});
structure!(VOLUME_MOUNT, VOLUME_MOUNT_TY, "v1alpha1.VolumeMountConfig", {
    "hostPath" => &STR,
    "mountPath" => &STR,
    "readonly" => &BOOL,
});
list!(
    VOLUME_MOUNTS,
    &VOLUME_MOUNT_TY,
    "[]v1alpha1.VolumeMountConfig"
);
structure!(RESOURCES, RESOURCES_TY, "v1alpha1.ResourcesConfig", {
    "requests" => &OBJECT,
    "limits" => &OBJECT,
});
structure!(ADMISSION_PLUGIN, ADMISSION_PLUGIN_TY, "v1alpha1.AdmissionPluginConfig", {
    "name" => &STR,
    "configuration" => &OBJECT,
});
list!(
    ADMISSION_PLUGINS,
    &ADMISSION_PLUGIN_TY,
    "v1alpha1.AdmissionPluginConfigList"
);
structure!(AUTHORIZER, AUTHORIZER_TY, "v1alpha1.AuthorizationConfigAuthorizerConfig", {
    "type" => &STR,
    "name" => &STR,
    "webhook" => &OBJECT,
});
list!(
    AUTHORIZERS,
    &AUTHORIZER_TY,
    "v1alpha1.AuthorizationConfigAuthorizerConfigList"
);
structure!(API_SERVER, API_SERVER_TY, "v1alpha1.APIServerConfig", {
    "image" => &STR,
    "extraArgs" => &STR_MAP,
    "extraVolumes" => &VOLUME_MOUNTS,
    "env" => &STR_MAP,
    "certSANs" => &STRS,
    "disablePodSecurityPolicy" => &BOOL,
    "admissionControl" => &ADMISSION_PLUGINS,
    "auditPolicy" => &OBJECT,
    "resources" => &RESOURCES_TY,
    "authorizationConfig" => &AUTHORIZERS,
});
structure!(CONTROLLER_MANAGER, CONTROLLER_MANAGER_TY, "v1alpha1.ControllerManagerConfig", {
    "image" => &STR,
    "extraArgs" => &STR_MAP,
    "extraVolumes" => &VOLUME_MOUNTS,
    "env" => &STR_MAP,
    "resources" => &RESOURCES_TY,
});
structure!(PROXY, PROXY_TY, "v1alpha1.ProxyConfig", {
    "disabled" => &BOOL,
    "image" => &STR,
    "mode" => &STR,
    "extraArgs" => &STR_MAP,
});
structure!(SCHEDULER, SCHEDULER_TY, "v1alpha1.SchedulerConfig", {
    "image" => &STR,
    "extraArgs" => &STR_MAP,
    "extraVolumes" => &VOLUME_MOUNTS,
    "env" => &STR_MAP,
    "resources" => &RESOURCES_TY,
    "config" => &OBJECT,
});
structure!(REGISTRY_KUBERNETES, REGISTRY_KUBERNETES_TY, "v1alpha1.RegistryKubernetesConfig", {
    "disabled" => &BOOL,
});
structure!(REGISTRY_SERVICE, REGISTRY_SERVICE_TY, "v1alpha1.RegistryServiceConfig", {
    "disabled" => &BOOL,
    "endpoint" => &STR,
});
structure!(DISCOVERY_REGISTRIES, DISCOVERY_REGISTRIES_TY, "v1alpha1.DiscoveryRegistriesConfig", {
    "kubernetes" => &REGISTRY_KUBERNETES_TY,
    "service" => &REGISTRY_SERVICE_TY,
});
structure!(DISCOVERY, DISCOVERY_TY, "v1alpha1.ClusterDiscoveryConfig", {
    "enabled" => &BOOL,
    "registries" => &DISCOVERY_REGISTRIES_TY,
});
structure!(ETCD, ETCD_TY, "v1alpha1.EtcdConfig", {
    "image" => &STR,
    "ca" => &CERT_AND_KEY_TY,
    "extraArgs" => &STR_MAP,
    "subnet" => &STR,
    "advertisedSubnets" => &STRS,
    "listenSubnets" => &STRS,
});
structure!(CORE_DNS, CORE_DNS_TY, "v1alpha1.CoreDNS", {
    "disabled" => &BOOL,
    "image" => &STR,
});
structure!(EXTERNAL_CLOUD_PROVIDER, EXTERNAL_CLOUD_PROVIDER_TY, "v1alpha1.ExternalCloudProviderConfig", {
    "enabled" => &BOOL,
    "manifests" => &STRS,
});
structure!(INLINE_MANIFEST, INLINE_MANIFEST_TY, "v1alpha1.ClusterInlineManifest", {
    "name" => &STR,
    "contents" => &STR,
});
list!(
    INLINE_MANIFESTS,
    &INLINE_MANIFEST_TY,
    "v1alpha1.ClusterInlineManifests"
);
structure!(ADMIN_KUBECONFIG, ADMIN_KUBECONFIG_TY, "v1alpha1.AdminKubeconfigConfig", {
    "certLifetime" => &DURATION,
});

// ------------------------------------------------------------------------------ typed documents

structure!(HOSTNAME_CONFIG, HOSTNAME_CONFIG_TY, "network.HostnameConfigV1Alpha1", {
    "apiVersion" => &STR,
    "kind" => &STR,
    "auto" => &STR,
    "hostname" => &STR,
});
structure!(NAMESERVER, NAMESERVER_TY, "network.NameserverConfig", { "address" => &STR });
list!(NAMESERVERS, &NAMESERVER_TY, "[]network.NameserverConfig");
structure!(SEARCH_DOMAINS, SEARCH_DOMAINS_TY, "network.SearchDomainsConfig", {
    "domains" => &STRS,
    "disableDefault" => &BOOL,
});
structure!(RESOLVER_CONFIG, RESOLVER_CONFIG_TY, "network.ResolverConfigV1Alpha1", {
    "apiVersion" => &STR,
    "kind" => &STR,
    "nameservers" => &NAMESERVERS,
    "searchDomains" => &SEARCH_DOMAINS_TY,
});
structure!(NTP, NTP_TY, "network.NTPConfig", { "servers" => &STRS });
structure!(PTP, PTP_TY, "network.PTPConfig", { "devices" => &STRS });
structure!(TIME_SYNC_CONFIG, TIME_SYNC_CONFIG_TY, "network.TimeSyncConfigV1Alpha1", {
    "apiVersion" => &STR,
    "kind" => &STR,
    "enabled" => &BOOL,
    "bootTimeout" => &DURATION,
    "ntp" => &NTP_TY,
    "ptp" => &PTP_TY,
});
structure!(STATIC_HOST_CONFIG, STATIC_HOST_CONFIG_TY, "network.StaticHostConfigV1Alpha1", {
    "apiVersion" => &STR,
    "kind" => &STR,
    "name" => &STR,
    "hostnames" => &STRS,
});
structure!(LAYER2_VIP_CONFIG, LAYER2_VIP_CONFIG_TY, "network.Layer2VIPConfigV1Alpha1", {
    "apiVersion" => &STR,
    "kind" => &STR,
    "name" => &STR,
    "link" => &STR,
});
structure!(REGISTRY_ENDPOINT, REGISTRY_ENDPOINT_TY, "cri.RegistryEndpoint", {
    "url" => &STR,
    "overridePath" => &BOOL,
});
list!(
    REGISTRY_ENDPOINTS,
    &REGISTRY_ENDPOINT_TY,
    "[]cri.RegistryEndpoint"
);
structure!(REGISTRY_MIRROR_CONFIG, REGISTRY_MIRROR_CONFIG_TY, "cri.RegistryMirrorConfigV1Alpha1", {
    "apiVersion" => &STR,
    "kind" => &STR,
    "name" => &STR,
    "endpoints" => &REGISTRY_ENDPOINTS,
    "skipFallback" => &BOOL,
});
structure!(TRUSTED_ROOTS_CONFIG, TRUSTED_ROOTS_CONFIG_TY, "security.TrustedRootsConfigV1Alpha1", {
    "apiVersion" => &STR,
    "kind" => &STR,
    "name" => &STR,
    "certificates" => &STR,
});
structure!(KMSG_LOG_CONFIG, KMSG_LOG_CONFIG_TY, "runtime.KmsgLogV1Alpha1", {
    "apiVersion" => &STR,
    "kind" => &STR,
    "name" => &STR,
    "url" => &STR,
});
structure!(EVENT_SINK_CONFIG, EVENT_SINK_CONFIG_TY, "runtime.EventSinkV1Alpha1", {
    "apiVersion" => &STR,
    "kind" => &STR,
    "endpoint" => &STR,
});
structure!(WATCHDOG_TIMER_CONFIG, WATCHDOG_TIMER_CONFIG_TY, "runtime.WatchdogTimerV1Alpha1", {
    "apiVersion" => &STR,
    "kind" => &STR,
    "device" => &STR,
    "timeout" => &DURATION,
});
structure!(EXTENSION_CONFIG_FILE, EXTENSION_CONFIG_FILE_TY, "extensions.ConfigFile", {
    "content" => &STR,
    "mountPath" => &STR,
});
list!(
    EXTENSION_CONFIG_FILES,
    &EXTENSION_CONFIG_FILE_TY,
    "[]extensions.ConfigFile"
);
structure!(EXTENSION_SERVICE_CONFIG, EXTENSION_SERVICE_CONFIG_TY, "extensions.ServiceConfigV1Alpha1", {
    "apiVersion" => &STR,
    "kind" => &STR,
    "name" => &STR,
    "configFiles" => &EXTENSION_CONFIG_FILES,
    "environment" => &STRS,
});

/// A typed (`apiVersion: v1alpha1` + `kind`) document this validator models.
#[derive(Debug)]
pub(crate) struct Kind {
    pub name: &'static str,
    pub ty: &'static Ty,
    /// Documents of this kind carry a `name` (several may coexist with distinct names).
    pub named: bool,
    /// The first contract (Talos minor) that knows the kind.
    pub since_minor: u32,
}

/// Every typed document kind the validator decodes and checks.
pub(crate) static KINDS: &[Kind] = &[
    Kind {
        name: "HostnameConfig",
        ty: &HOSTNAME_CONFIG_TY,
        named: false,
        since_minor: 12,
    },
    Kind {
        name: "ResolverConfig",
        ty: &RESOLVER_CONFIG_TY,
        named: false,
        since_minor: 12,
    },
    Kind {
        name: "TimeSyncConfig",
        ty: &TIME_SYNC_CONFIG_TY,
        named: false,
        since_minor: 12,
    },
    Kind {
        name: "StaticHostConfig",
        ty: &STATIC_HOST_CONFIG_TY,
        named: true,
        since_minor: 12,
    },
    Kind {
        name: "Layer2VIPConfig",
        ty: &LAYER2_VIP_CONFIG_TY,
        named: true,
        since_minor: 12,
    },
    Kind {
        name: "RegistryMirrorConfig",
        ty: &REGISTRY_MIRROR_CONFIG_TY,
        named: true,
        since_minor: 13,
    },
    Kind {
        name: "TrustedRootsConfig",
        ty: &TRUSTED_ROOTS_CONFIG_TY,
        named: true,
        since_minor: 12,
    },
    Kind {
        name: "KmsgLogConfig",
        ty: &KMSG_LOG_CONFIG_TY,
        named: true,
        since_minor: 12,
    },
    Kind {
        name: "EventSinkConfig",
        ty: &EVENT_SINK_CONFIG_TY,
        named: false,
        since_minor: 12,
    },
    Kind {
        name: "WatchdogTimerConfig",
        ty: &WATCHDOG_TIMER_CONFIG_TY,
        named: false,
        since_minor: 12,
    },
    Kind {
        name: "ExtensionServiceConfig",
        ty: &EXTENSION_SERVICE_CONFIG_TY,
        named: true,
        since_minor: 12,
    },
];

/// Kinds Talos v1.12/v1.13 knows that this validator does not model: refused with a message
/// saying so, rather than passed unchecked.
pub(crate) static UNMODELED_KINDS: &[&str] = &[
    "BondConfig",
    "BridgeConfig",
    "DHCPv4Config",
    "DHCPv6Config",
    "DummyLinkConfig",
    "EthernetConfig",
    "ExistingVolumeConfig",
    "HCloudVIPConfig",
    "ImageCacheConfig",
    "KubeSpanConfig",
    "KubeSpanEndpointsConfig",
    "LinkAliasConfig",
    "LinkConfig",
    "NetworkDefaultActionConfig",
    "NetworkRuleConfig",
    "OOMConfig",
    "PCIDriverRebindConfig",
    "RawVolumeConfig",
    "RegistryAuthConfig",
    "RegistryTLSConfig",
    "SideroLinkConfig",
    "SwapVolumeConfig",
    "TCPProbeConfig",
    "UserVolumeConfig",
    "VLANConfig",
    "VolumeConfig",
    "WireguardConfig",
    "ZswapConfig",
];

/// Every allowed key path under a schema, e.g. `machine.install.diskSelector.size`; list
/// items add `[]`, map values `*`.
pub(crate) fn paths(ty: &Ty, prefix: &str, out: &mut Vec<String>) {
    match ty {
        Ty::Struct(s) => {
            for field in s.fields {
                let path = if prefix.is_empty() {
                    field.key.to_owned()
                } else {
                    format!("{prefix}.{}", field.key)
                };
                out.push(path.clone());
                paths(field.ty, &path, out);
            }
        }
        Ty::List(elem, _) => paths(elem, &format!("{prefix}[]"), out),
        Ty::Map(elem, _) => paths(elem, &format!("{prefix}.*"), out),
        _ => {}
    }
}
