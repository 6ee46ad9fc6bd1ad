//! `ironclaim crds`: the CustomResourceDefinitions of the ironclaim.dev API,
//! generated from the code, as one YAML stream (`| kubectl apply -f -`).

use crate::exit::Failure;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<(), Failure> {
    let yaml = ironclaim_k8s::api::crds_yaml().map_err(Failure::world)?;
    crate::output::write(&yaml)
}
