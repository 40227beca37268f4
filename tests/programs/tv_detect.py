"""torchvision fasterrcnn_mobilenet_v3_large_320_fpn, random weights, in eval on 2 random
images."""
import torch
from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

torch.manual_seed(0)
dev = "cuda" if torch.cuda.is_available() else "cpu"
model = fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None, num_classes=5,
                                              box_score_thresh=0.0).eval().to(dev)
g = torch.Generator().manual_seed(1)
imgs = [torch.rand(3, 240, 320, generator=g).to(dev), torch.rand(3, 200, 260, generator=g).to(dev)]
with torch.no_grad():
    out = model(imgs)
res = [(len(o["boxes"]), round(o["boxes"].sum().item(), 3), round(o["scores"].sum().item(), 5))
       for o in out]
print("RESULT tv_detect (n_boxes, box_sum, score_sum) per image =", res)
