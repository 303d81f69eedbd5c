use compiler::passes::schedule_stream as ss;
use compiler::problem::Problem;
fn main() {
    let a: Vec<u32> = std::env::args().skip(1).map(|s| s.parse().unwrap()).collect();
    let p = Problem::attention(a[0], a[1], a[3], false, true, runtime::layer::Softmax::Safe);
    match ss::run_whole(&p, a[2]) {
        Ok(s) => println!("whole cycles {}", s.cycles),
        Err(e) => println!("whole err {e}"),
    }
    for norm in [runtime::layer::Normalisation::Deferred] {
        match ss::run_whole_as(&p, a[2], norm) {
            Ok(s) => println!("whole_as cycles {}", s.cycles),
            Err(e) => println!("whole_as err {e}"),
        }
    }
}
