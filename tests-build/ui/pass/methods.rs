use lock_runtime::{distributed_lock, LockError};

struct Shop {
    tenant: String,
    sold: u64,
}

struct Req {
    item: Item,
}

struct Item {
    id: u32,
}

impl Shop {
    #[distributed_lock(key = "{self.tenant}:stock:{req.item.id}", wait = "0s")]
    async fn sold(&self, req: &Req) -> Result<u64, LockError> {
        let _ = req.item.id;
        Ok(self.sold)
    }

    #[distributed_lock(key = "{self.tenant}:sell", lease = "500ms", on_lost = "abort")]
    async fn sell(&mut self, n: u64) -> Result<u64, LockError> {
        self.sold += n;
        Ok(self.sold)
    }
}

trait Seller {
    async fn sell_one(&self) -> Result<(), LockError>;
}

impl Seller for Shop {
    #[distributed_lock(key = "{self.tenant}:one")]
    async fn sell_one(&self) -> Result<(), LockError> {
        Ok(())
    }
}

fn main() {
    let mut shop = Shop { tenant: "t".into(), sold: 0 };
    let req = Req { item: Item { id: 1 } };
    drop(shop.sold(&req));
    drop(shop.sell(1));
    drop(shop.sell_one());
}
