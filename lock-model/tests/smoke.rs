use lock_model::check;
use lock_model::decide::Timing;
use lock_model::defects::Defects;
use lock_model::world::{ClientPlan, Deployment, Faults, Plan, World};

#[test]
fn smoke() {
    let w = World {
        clients: vec![
            ClientPlan {
                requests: vec![Plan::write(0)],
                lingering: vec![],
            },
            ClientPlan {
                requests: vec![Plan::write(0).wait(5000)],
                lingering: vec![],
            },
        ],
        keys: 1,
        deployment: Deployment::Redis,
        faults: Faults::default(),
        defects: Defects::TODAY,
        timing: Timing::default(),
    };
    let r = check::run("smoke", w, None);
    for (p, t) in &r.found {
        println!("== {p}\n{t}");
    }
}
