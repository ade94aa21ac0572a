//! Certificates and keys for one control plane, generated in Rust (rcgen, ring).
//!
//! A cluster CA signs the API server's serving certificate and every client certificate;
//! the ServiceAccount token signing key is a separate ECDSA P-256 key pair. The CA can be
//! handed in, so that a control plane can be built around CAs that exist elsewhere (an
//! emulated Talos machine uses the Kubernetes CA of its applied machine config), and so can
//! the signing key, an etcd CA (etcd then serves TLS and wants client certificates) and an
//! aggregator (front-proxy) CA.

use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

use crate::Error;

/// A CA certificate and its private key, both PEM.
#[derive(Clone)]
pub struct CertificateAuthority {
    /// The CA certificate, PEM.
    pub cert_pem: String,
    /// The CA private key, PEM (PKCS#8).
    pub key_pem: String,
}

impl std::fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("key_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// A certificate and its key, both PEM.
#[derive(Clone)]
pub struct CertPair {
    /// Certificate, PEM.
    pub cert_pem: String,
    /// Private key, PEM.
    pub key_pem: String,
}

impl CertificateAuthority {
    /// A new self-signed ECDSA P-256 CA named `cn`.
    pub fn generate(cn: &str) -> Result<Self, Error> {
        let key = KeyPair::generate().map_err(pki_err("generating CA key"))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(cn, None);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params
            .self_signed(&key)
            .map_err(pki_err("self-signing CA"))?;
        Ok(Self {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    fn issuer(&self) -> Result<Issuer<'static, KeyPair>, Error> {
        let key = KeyPair::from_pem(&self.key_pem).map_err(pki_err("parsing CA key"))?;
        Issuer::from_ca_cert_pem(&self.cert_pem, key).map_err(pki_err("parsing CA certificate"))
    }

    /// A client certificate for user `cn`, in `group` when given (the API server maps the
    /// subject's O to a group).
    pub fn client(&self, cn: &str, group: Option<&str>) -> Result<CertPair, Error> {
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(cn, group);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(&params)
    }

    /// A serving certificate for the given IPs and DNS names.
    pub fn server(&self, cn: &str, ips: &[IpAddr], dns: &[String]) -> Result<CertPair, Error> {
        self.named(cn, ips, dns, vec![ExtendedKeyUsagePurpose::ServerAuth])
    }

    /// A certificate for both serving and connecting as a client (etcd's: its peers dial
    /// each other with it).
    pub fn server_and_client(
        &self,
        cn: &str,
        ips: &[IpAddr],
        dns: &[String],
    ) -> Result<CertPair, Error> {
        self.named(
            cn,
            ips,
            dns,
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )
    }

    /// A certificate for the given IPs and DNS names with these extended key usages.
    fn named(
        &self,
        cn: &str,
        ips: &[IpAddr],
        dns: &[String],
        ekus: Vec<ExtendedKeyUsagePurpose>,
    ) -> Result<CertPair, Error> {
        let names: Vec<String> = ips
            .iter()
            .map(ToString::to_string)
            .chain(dns.iter().cloned())
            .collect();
        let mut params = CertificateParams::new(names).map_err(pki_err("building SANs"))?;
        params.distinguished_name = dn(cn, None);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = ekus;
        self.sign(&params)
    }

    fn sign(&self, params: &CertificateParams) -> Result<CertPair, Error> {
        let key = KeyPair::generate().map_err(pki_err("generating key"))?;
        let cert = params
            .signed_by(&key, &self.issuer()?)
            .map_err(pki_err("signing certificate"))?;
        Ok(CertPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// What a control plane's certificates are built around; `Default` is a fresh cluster CA,
/// a fresh signing key, plain-HTTP etcd and no front proxy.
#[derive(Clone, Debug, Default)]
pub struct PkiInputs {
    /// The cluster CA (a new one when `None`).
    pub ca: Option<CertificateAuthority>,
    /// The ServiceAccount signing key, PKCS#8 PEM (a new P-256 one when `None`).
    pub service_account_key_pem: Option<String>,
    /// The etcd CA: etcd's serving certificate and the API server's etcd client certificate
    /// (`None`: etcd on plain HTTP).
    pub etcd_ca: Option<CertificateAuthority>,
    /// The aggregator (front-proxy) CA: the API server's proxy client certificate and its
    /// request-header client CA (`None`: no front proxy).
    pub aggregator_ca: Option<CertificateAuthority>,
}

/// etcd's certificates, from a given etcd CA.
pub struct EtcdPki {
    /// The etcd CA certificate, PEM.
    pub ca_pem: String,
    /// etcd's serving (and peer) certificate.
    pub server: CertPair,
    /// The API server's etcd client certificate (CN `kube-apiserver-etcd-client`).
    pub apiserver_client: CertPair,
}

/// The front proxy's certificates, from a given aggregator CA.
pub struct FrontProxyPki {
    /// The aggregator CA certificate, PEM.
    pub ca_pem: String,
    /// The API server's proxy client certificate (CN `front-proxy-client`).
    pub client: CertPair,
}

/// Everything one control plane needs.
pub struct Pki {
    /// The cluster CA (client CA and serving CA).
    pub ca: CertificateAuthority,
    /// The API server's serving certificate.
    pub apiserver: CertPair,
    /// `admin`, in `system:masters`; used by the test, KCM, scheduler and KWOK.
    pub admin: CertPair,
    /// ServiceAccount token signing key (PEM private key) and its public half.
    pub sa_key_pem: String,
    /// Public half of the signing key, PEM.
    pub sa_pub_pem: String,
    /// etcd over TLS, when an etcd CA was given.
    pub etcd: Option<EtcdPki>,
    /// The front proxy, when an aggregator CA was given.
    pub front_proxy: Option<FrontProxyPki>,
}

impl Pki {
    /// Generates a PKI (or uses `ca`) for an API server reachable at `address` plus `extra_dns`,
    /// the `kubernetes` Service at [`crate::FIRST_SERVICE_IP`].
    pub fn generate(
        ca: Option<CertificateAuthority>,
        address: IpAddr,
        extra_dns: &[String],
    ) -> Result<Self, Error> {
        let inputs = PkiInputs {
            ca,
            ..PkiInputs::default()
        };
        Self::generate_with(
            inputs,
            address,
            extra_dns,
            crate::control_plane::FIRST_SERVICE_IP,
        )
    }

    /// A PKI around `inputs`, for an API server reachable at `address` plus `extra_dns` whose
    /// `kubernetes` Service has the ClusterIP `service_ip`.
    pub fn generate_with(
        inputs: PkiInputs,
        address: IpAddr,
        extra_dns: &[String],
        service_ip: IpAddr,
    ) -> Result<Self, Error> {
        let ca = match inputs.ca {
            Some(ca) => ca,
            None => CertificateAuthority::generate("kontinuum-testbed-ca")?,
        };
        let mut dns: Vec<String> = [
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        let mut ips = vec![address, service_ip];
        // An IP address among the extra names is an IP SAN (a DNS SAN would not match it).
        for name in extra_dns {
            match name.parse::<IpAddr>() {
                Ok(ip) if !ips.contains(&ip) => ips.push(ip),
                Ok(_) => {}
                Err(_) => dns.push(name.clone()),
            }
        }
        let localhost = IpAddr::from([127, 0, 0, 1]);
        if address != localhost {
            ips.push(localhost);
        }
        let apiserver = ca.server("kube-apiserver", &ips, &dns)?;
        let admin = ca.client("admin", Some("system:masters"))?;
        let sa = match &inputs.service_account_key_pem {
            Some(pem) => KeyPair::from_pem(pem).map_err(pki_err("parsing service-account key"))?,
            None => KeyPair::generate().map_err(pki_err("generating service-account key"))?,
        };
        let etcd = match inputs.etcd_ca {
            Some(etcd_ca) => Some(EtcdPki {
                server: etcd_ca.server_and_client("etcd", &ips, &["localhost".to_owned()])?,
                apiserver_client: etcd_ca.client("kube-apiserver-etcd-client", None)?,
                ca_pem: etcd_ca.cert_pem,
            }),
            None => None,
        };
        let front_proxy = match inputs.aggregator_ca {
            Some(aggregator_ca) => Some(FrontProxyPki {
                client: aggregator_ca.client("front-proxy-client", None)?,
                ca_pem: aggregator_ca.cert_pem,
            }),
            None => None,
        };
        Ok(Self {
            ca,
            apiserver,
            admin,
            sa_key_pem: sa.serialize_pem(),
            sa_pub_pem: sa.public_key_pem(),
            etcd,
            front_proxy,
        })
    }
}

fn dn(cn: &str, org: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    if let Some(org) = org {
        dn.push(DnType::OrganizationName, org);
    }
    dn
}

fn pki_err(what: &'static str) -> impl Fn(rcgen::Error) -> Error {
    move |source| Error::Pki { what, source }
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::extensions::GeneralName;
    use x509_parser::pem::parse_x509_pem;

    fn parse(pem: &str) -> x509_parser::pem::Pem {
        parse_x509_pem(pem.as_bytes()).unwrap().1
    }

    #[test]
    fn apiserver_certificate_is_signed_by_the_ca_and_names_every_address() {
        let address = IpAddr::from([127, 10, 0, 7]);
        let pki = Pki::generate(None, address, &["machine-7".to_string()]).unwrap();
        let ca_pem = parse(&pki.ca.cert_pem);
        let ca = ca_pem.parse_x509().unwrap();
        let server_pem = parse(&pki.apiserver.cert_pem);
        let server = server_pem.parse_x509().unwrap();

        assert!(ca.is_ca());
        assert_eq!(server.issuer(), ca.subject());
        server.verify_signature(Some(ca.public_key())).unwrap();

        let san = server.subject_alternative_name().unwrap().unwrap();
        let mut ips = Vec::new();
        let mut names = Vec::new();
        for name in &san.value.general_names {
            match name {
                GeneralName::IPAddress(bytes) => ips.push(bytes.to_vec()),
                GeneralName::DNSName(dns) => names.push((*dns).to_string()),
                _ => {}
            }
        }
        assert!(ips.contains(&vec![127, 10, 0, 7]), "{ips:?}");
        assert!(ips.contains(&vec![10, 96, 0, 1]), "{ips:?}");
        assert!(ips.contains(&vec![127, 0, 0, 1]), "{ips:?}");
        for dns in [
            "kubernetes.default.svc.cluster.local",
            "localhost",
            "machine-7",
        ] {
            assert!(
                names.iter().any(|n| n == dns),
                "{dns} missing from {names:?}"
            );
        }
        let eku = server.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && !eku.client_auth);
    }

    #[test]
    fn admin_is_a_client_in_system_masters() {
        let pki = Pki::generate(None, IpAddr::from([127, 0, 0, 1]), &[]).unwrap();
        let pem = parse(&pki.admin.cert_pem);
        let admin = pem.parse_x509().unwrap();
        let org: Vec<_> = admin
            .subject()
            .iter_organization()
            .map(|o| o.as_str().unwrap().to_string())
            .collect();
        assert_eq!(org, ["system:masters"]);
        let cn: Vec<_> = admin
            .subject()
            .iter_common_name()
            .map(|o| o.as_str().unwrap().to_string())
            .collect();
        assert_eq!(cn, ["admin"]);
        let eku = admin.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
    }

    #[test]
    fn a_given_ca_is_reused() {
        let ca = CertificateAuthority::generate("talos-kubernetes-ca").unwrap();
        let pki = Pki::generate(Some(ca.clone()), IpAddr::from([127, 0, 0, 1]), &[]).unwrap();
        assert_eq!(pki.ca.cert_pem, ca.cert_pem);
        let ca_pem = parse(&ca.cert_pem);
        let ca_cert = ca_pem.parse_x509().unwrap();
        let admin_pem = parse(&pki.admin.cert_pem);
        admin_pem
            .parse_x509()
            .unwrap()
            .verify_signature(Some(ca_cert.public_key()))
            .unwrap();
    }

    #[test]
    fn given_etcd_and_aggregator_cas_and_signing_key_are_used() {
        let etcd_ca = CertificateAuthority::generate("etcd").unwrap();
        let aggregator_ca = CertificateAuthority::generate("aggregator").unwrap();
        let sa = KeyPair::generate().unwrap();
        let inputs = PkiInputs {
            ca: None,
            service_account_key_pem: Some(sa.serialize_pem()),
            etcd_ca: Some(etcd_ca.clone()),
            aggregator_ca: Some(aggregator_ca.clone()),
        };
        let service_ip = IpAddr::from([10, 112, 0, 1]);
        let pki =
            Pki::generate_with(inputs, IpAddr::from([127, 0, 0, 9]), &[], service_ip).unwrap();
        assert_eq!(pki.sa_pub_pem, sa.public_key_pem());
        let verify = |cert_pem: &str, ca_pem: &str| {
            let ca = parse(ca_pem);
            let ca = ca.parse_x509().unwrap();
            let cert = parse(cert_pem);
            let cert = cert.parse_x509().unwrap();
            cert.verify_signature(Some(ca.public_key())).is_ok()
        };
        let etcd = pki.etcd.unwrap();
        assert!(verify(&etcd.server.cert_pem, &etcd_ca.cert_pem));
        assert!(verify(&etcd.apiserver_client.cert_pem, &etcd_ca.cert_pem));
        let server = parse(&etcd.server.cert_pem);
        let server = server.parse_x509().unwrap();
        let eku = server.extended_key_usage().unwrap().unwrap().value;
        assert!(
            eku.server_auth && eku.client_auth,
            "etcd peers dial with it too"
        );
        let proxy = pki.front_proxy.unwrap();
        assert!(verify(&proxy.client.cert_pem, &aggregator_ca.cert_pem));
        let apiserver = parse(&pki.apiserver.cert_pem);
        let apiserver = apiserver.parse_x509().unwrap();
        let san = apiserver.subject_alternative_name().unwrap().unwrap();
        assert!(
            san.value
                .general_names
                .iter()
                .any(|n| matches!(n, GeneralName::IPAddress(b) if *b == [10, 112, 0, 1]))
        );
    }

    #[test]
    fn debug_output_hides_the_ca_key() {
        let ca = CertificateAuthority::generate("ca").unwrap();
        assert!(!format!("{ca:?}").contains("PRIVATE KEY"));
    }
}
