//! `ironclaim crds`: the CustomResourceDefinitions of the ironclaim.dev API,
//! generated from the code: a YAML stream, or with `-o json` one `List`
//! (either goes to `kubectl apply --server-side -f -`).

use crate::exit::Failure;
use anyhow::anyhow;

#[derive(clap::Args)]
pub struct Args {
    /// yaml (one document per CRD) or json (one List).
    #[arg(short, long, value_enum, default_value_t = Format::Yaml)]
    output: Format,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    /// A stream of YAML documents.
    Yaml,
    /// One JSON List.
    Json,
}

pub fn run(args: Args) -> Result<(), Failure> {
    let text = match args.output {
        Format::Yaml => ironclaim_k8s::api::crds_yaml().map_err(Failure::world)?,
        Format::Json => {
            let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": ironclaim_k8s::api::crds()});
            let mut text = serde_json::to_string_pretty(&list).map_err(|e| Failure::world(anyhow!("cannot write the CRDs as JSON: {e}")))?;
            text.push('\n');
            text
        }
    };
    crate::output::write(&text)
}
