//! Certificates and keys for one control plane, generated in Rust (rcgen, ring).
//!
//! A cluster CA signs the API server's serving certificate and every client certificate;
//! the ServiceAccount token signing key is a separate ECDSA P-256 key pair. The CA can be
//! handed in, so that a control plane can be built around CAs that exist elsewhere (an
//! emulated Talos machine uses the Kubernetes CA of its applied machine config).

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
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
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
}

impl Pki {
    /// Generates a PKI (or uses `ca`) for an API server reachable at `address` plus `extra_dns`.
    pub fn generate(
        ca: Option<CertificateAuthority>,
        address: IpAddr,
        extra_dns: &[String],
    ) -> Result<Self, Error> {
        let ca = match ca {
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
        dns.extend(extra_dns.iter().cloned());
        let mut ips = vec![address, crate::control_plane::FIRST_SERVICE_IP];
        let localhost = IpAddr::from([127, 0, 0, 1]);
        if address != localhost {
            ips.push(localhost);
        }
        let apiserver = ca.server("kube-apiserver", &ips, &dns)?;
        let admin = ca.client("admin", Some("system:masters"))?;
        let sa = KeyPair::generate().map_err(pki_err("generating service-account key"))?;
        Ok(Self {
            ca,
            apiserver,
            admin,
            sa_key_pem: sa.serialize_pem(),
            sa_pub_pem: sa.public_key_pem(),
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
    fn debug_output_hides_the_ca_key() {
        let ca = CertificateAuthority::generate("ca").unwrap();
        assert!(!format!("{ca:?}").contains("PRIVATE KEY"));
    }
}
