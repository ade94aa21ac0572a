//! A Markdown benchmark report: where and when it ran, then one section per measurement.
//! Every subcommand builds one [`Report`] and writes it with [`Report::write_to`].

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;

use crate::procfs::Host;
use crate::stats::fmt_kib;

/// A Markdown table.
#[derive(Clone, Debug, Default)]
pub struct Table {
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Self {
        Self {
            headers: headers.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) -> &mut Self {
        self.rows.push(cells);
        self
    }

    fn render(&self, out: &mut String) {
        let line = |cells: &[String]| {
            let escaped: Vec<String> = cells.iter().map(|c| c.replace('|', "\\|")).collect();
            format!("| {} |\n", escaped.join(" | "))
        };
        out.push_str(&line(&self.headers));
        let rule: Vec<String> = self.headers.iter().map(|_| "---".to_owned()).collect();
        out.push_str(&line(&rule));
        for row in &self.rows {
            let mut row = row.clone();
            row.resize(self.headers.len(), String::new());
            out.push_str(&line(&row));
        }
    }
}

/// Part of a section.
#[derive(Clone, Debug)]
pub enum Block {
    Table(Table),
    Text(String),
}

/// A `##` section.
#[derive(Clone, Debug)]
pub struct Section {
    pub title: String,
    pub blocks: Vec<Block>,
}

impl Section {
    pub fn new(title: impl Into<String>) -> Self {
        Self {
            title: title.into(),
            blocks: Vec::new(),
        }
    }

    pub fn table(mut self, table: Table) -> Self {
        self.blocks.push(Block::Table(table));
        self
    }

    pub fn text(mut self, text: impl Into<String>) -> Self {
        self.blocks.push(Block::Text(text.into()));
        self
    }
}

/// Where and how the benchmark ran.
#[derive(Clone, Debug)]
pub struct Environment {
    pub date: String,
    pub git_revision: String,
    pub host: Host,
    pub build: &'static str,
    pub command: String,
}

impl Environment {
    pub fn capture() -> Self {
        Self {
            date: jiff::Timestamp::now()
                .round(jiff::Unit::Second)
                .map_or_else(|_| jiff::Timestamp::now().to_string(), |t| t.to_string()),
            git_revision: git_revision(),
            host: Host::read(),
            build: if cfg!(debug_assertions) {
                "debug (unoptimised: figures are pessimistic)"
            } else {
                "release"
            },
            command: std::env::args().collect::<Vec<_>>().join(" "),
        }
    }
}

/// `HEAD`'s short hash, `+dirty` with uncommitted changes; read-only git calls.
fn git_revision() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("--no-optional-locks")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(rev) if !rev.is_empty() => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty { format!("{rev}+dirty") } else { rev }
        }
        _ => "unknown".to_owned(),
    }
}

/// A whole report.
#[derive(Clone, Debug)]
pub struct Report {
    pub title: String,
    pub environment: Environment,
    pub sections: Vec<Section>,
}

impl Report {
    pub fn new(title: impl Into<String>, environment: Environment) -> Self {
        Self {
            title: title.into(),
            environment,
            sections: Vec::new(),
        }
    }

    pub fn push(&mut self, section: Section) {
        self.sections.push(section);
    }

    pub fn render(&self) -> String {
        let env = &self.environment;
        let mut out = String::new();
        let _ = writeln!(out, "# {}\n", self.title);
        let mut table = Table::new(&["", ""]);
        table
            .row(vec!["date (UTC)".into(), env.date.clone()])
            .row(vec!["git revision".into(), env.git_revision.clone()])
            .row(vec![
                "machine".into(),
                format!(
                    "{} CPUs ({}), {} RAM, Linux {}",
                    env.host.cpus,
                    env.host.cpu_model,
                    fmt_kib(env.host.mem_total_kib),
                    env.host.kernel
                ),
            ])
            .row(vec![
                "load average at start (1/5/15 min)".into(),
                env.host.loadavg.clone(),
            ])
            .row(vec!["build".into(), env.build.to_owned()])
            .row(vec!["command".into(), format!("`{}`", env.command)]);
        table.render(&mut out);
        for section in &self.sections {
            let _ = writeln!(out, "\n## {}", section.title);
            for block in &section.blocks {
                out.push('\n');
                match block {
                    Block::Table(t) => t.render(&mut out),
                    Block::Text(t) => {
                        out.push_str(t.trim_end());
                        out.push('\n');
                    }
                }
            }
        }
        out
    }

    /// Writes the rendered report to `path` (creating its directory) and returns it.
    pub fn write_to(&self, path: &Path) -> anyhow::Result<String> {
        let text = self.render();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(path, &text).with_context(|| format!("writing {}", path.display()))?;
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_tables_and_text() {
        let env = Environment {
            date: "2026-01-01T00:00:00Z".into(),
            git_revision: "abc".into(),
            host: Host {
                cpus: 2,
                cpu_model: "cpu".into(),
                mem_total_kib: 2048,
                kernel: "6.1".into(),
                loadavg: "0.10 0.20 0.30".into(),
            },
            build: "release",
            command: "kontinuum-bench talos".into(),
        };
        let mut report = Report::new("Bench", env);
        let mut t = Table::new(&["a", "b"]);
        t.row(vec!["1".into(), "x|y".into()]).row(vec!["2".into()]);
        report.push(Section::new("S").table(t).text("note\n"));
        let text = report.render();
        assert!(text.starts_with("# Bench\n\n|  |  |\n"), "{text}");
        assert!(text.contains("| machine | 2 CPUs (cpu), 2.0 MiB RAM, Linux 6.1 |"));
        assert!(
            text.contains("\n## S\n\n| a | b |\n| --- | --- |\n| 1 | x\\|y |\n| 2 |  |\n\nnote\n")
        );
    }
}
